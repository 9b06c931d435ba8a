"""Each cell's inference with a dataloader of its own (the per-cell loop every kind can use).

Each cell yields ``(cell, gathered results, the loop's metrics, dataset_meta, timing)`` for rank
0's metric queue. Where a cell's dataloader comes from and what the model runs within are its
kind's (:mod:`.cell_kinds`); one dataloader for every corruption cell is
:mod:`.cell_kinds.one_pass`.
"""
import time
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Tuple

from ..utils.progress import Progress
from .cell_kinds import Cell, Inferred
from .metric_queue import cell_label
from .overlapped_loop import DEFAULT_POST_PROCESS_QUEUE, DEFAULT_PREFETCH, InferenceLoop

__all__ = ['loading_share', 'per_cell_cells']


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
    ``prefetch``: of :class:`~.overlapped_loop.OverlappedTestLoop`.
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
