"""The cells' inference: each cell with a dataloader of its own, or every cell in one pass.

Each cell yields ``(cell, gathered results, the loop's metrics, dataset_meta, timing)`` for rank
0's metric queue. Both run :class:`~.overlapped.OverlappedTestLoop`'s steps. Where a cell's
dataloader comes from and what the model runs within are its kind's (:mod:`..cell_kinds`); the
dataset that serves every corruption cell in one pass is :mod:`..cell_kinds.one_pass`'s.
"""
import time
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Tuple

from ...utils.progress import Progress
from ..cell_kinds import Cell, Inferred
from ..metric_queue import cell_label
from .overlapped import (
    DEFAULT_POST_PROCESS_QUEUE,
    DEFAULT_PREFETCH,
    InferenceLoop,
    OverlappedTestLoop,
    gather_parts,
)

__all__ = ['iterate_one_pass', 'loading_share', 'per_cell_cells']


def loading_share(runner, iterations: int) -> Dict[str, float]:
    """Seconds the test loop waited for data vs. its total, from mmengine's IterTimerHook."""
    if iterations <= 0:  # NOTE: [-0:] would be every iteration of the run
        return {'data_wait_s': 0.0, 'iter_s': 0.0}
    hub = runner.message_hub
    try:
        waits = hub.get_scalar('test/data_time').data[0][-iterations:]
        totals = hub.get_scalar('test/time').data[0][-iterations:]
    except KeyError:
        return {}
    return {'data_wait_s': round(float(waits.sum()), 3), 'iter_s': round(float(totals.sum()), 3)}


def per_cell_cells(runner, cells: List[Cell], metric_cfgs: Callable[[Cell], Tuple[Any, List]],
                   progress_bar: Progress, loader_of: Callable[[Cell], Any],
                   context_of: Optional[Callable[[Cell], ContextManager]] = None,
                   same_images: bool = True,
                   post_process_queue: int = DEFAULT_POST_PROCESS_QUEUE,
                   prefetch: int = DEFAULT_PREFETCH) -> Iterator[Inferred]:
    """Each cell's inference with its own dataloader (the dataset rebuilt per cell).

    Yields ``(cell, gathered results or None, the loop's metrics, dataset_meta, timing)``.
    ``loader_of``: a cell's dataloader config (its kind's); ``context_of``: what the model runs
    within for a cell (an attack's preprocessor); ``same_images``: every cell has the first's
    number of images (else each its own, counted as it starts). ``post_process_queue``,
    ``prefetch``: of :class:`~.loop.OverlappedTestLoop`.
    """
    counted = False
    for cell in cells:
        progress_bar.describe(cell_label(cell))
        start = time.perf_counter()
        loop = InferenceLoop(runner, loader_of(cell), metric_cfgs(cell)[0],
                             post_process_queue=post_process_queue, prefetch=prefetch)
        if not same_images:
            progress_bar.set_total(progress_bar.total + len(loop.dataloader.dataset))
        elif not counted:
            progress_bar.set_total(progress_bar.total
                                   + len(loop.dataloader.dataset) * len(cells))
            counted = True
        with context_of(cell) if context_of is not None else nullcontext():
            parts = loop.run()
        progress_bar.update(len(loop.dataloader.dataset))
        timing = {'inference_s': round(time.perf_counter() - start, 3),
                  **loading_share(runner, len(loop.dataloader)),
                  'post_process_wait_s': round(loop.post_process.wait_s, 3)}
        yield cell, parts, loop.evaluator.metrics, loop.evaluator.dataset_meta, timing


def _batch_size(batch: Any) -> int:
    """Samples in a batch of :meth:`~.overlapped.OverlappedTestLoop.batches` (a data batch)."""
    return len(batch['inputs'])


def iterate_one_pass(runner, loop: OverlappedTestLoop, cells: List[Cell], per_cell: int,
                     images: int, world: int, progress_bar: Progress) -> Iterator[Inferred]:
    """Every cell from one loop: per cell, this rank's ``per_cell`` batches, then the gathers.

    :mod:`..cell_kinds.one_pass` serves the batches, cell after cell; each metric's results are
    gathered at each cell's end.
    The gather runs on every rank, even one without a batch of the cell (``round_up=False`` with
    fewer images than ranks, ``drop_last``): the gather is a collective.
    """
    loop.begin()
    batches = loop.batches()
    index = 0
    try:
        for cell in cells:
            progress_bar.describe(cell_label(cell))
            start, shown, waited = time.perf_counter(), 0, loop.post_process.wait_s
            for b in range(per_cell):
                batch = next(batches)
                loop.run_iter(index, batch)
                index += 1
                # NOTE: this rank's samples times the ranks, as far as the cell has images
                seen = min(images, (b + 1) * _batch_size(batch) * world)
                progress_bar.update(seen - shown)
                shown = seen
            if shown < images:  # NOTE: this rank had fewer (or no) batches than others
                progress_bar.update(images - shown)
            loop.finish_batches()  # NOTE: the cell's last batches processed before its gather
            parts = [gather_parts(metric, images) for metric in loop.evaluator.metrics]
            timing = {'inference_s': round(time.perf_counter() - start, 3),
                      **loading_share(runner, per_cell),
                      'post_process_wait_s': round(loop.post_process.wait_s - waited, 3)}
            yield cell, parts, loop.evaluator.metrics, loop.evaluator.dataset_meta, timing
    finally:  # NOTE: also when the caller stops early (an error, a generator closed)
        loop.close(cancel=True)
    loop.end({})
