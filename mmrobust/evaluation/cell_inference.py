"""Each cell's inference: a dataloader per cell, or one for every cell (:mod:`.one_pass`).

The attack cells attacked in the model's data preprocessor; each yields ``(cell, gathered results,
the loop's metrics, dataset_meta, timing)`` for rank 0's metric queue.
"""
import time
from contextlib import ExitStack, contextmanager
from typing import Any, Dict, Iterator, List, Optional

from mmengine.config import Config
from mmengine.dist import get_dist_info

from ..models.utils import unwrap_model
from ..utils.progress import Progress
from .attacks import attack_batch, attack_of_cell
from .background import InferenceLoop, gather_parts
from .cells import (
    CLEAN,
    Cell,
    cell_dataloader,
    check_stored_leaves,
    gt_at_file_scale,
    is_attack_cell,
    is_shift_cell,
    shift_dataloader,
)
from .metric_queue import cell_label
from .one_pass import one_pass_loader
from .overlapped_loop import DEFAULT_POST_PROCESS_QUEUE, DEFAULT_PREFETCH, OverlappedTestLoop

__all__ = ['attacking', 'one_pass_cells', 'per_cell_cells']


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

def per_cell_cells(runner, cfg: Config, cells: List[Cell], metric_cfgs, seed: int,
                    bgr_compat: bool, corrupted_root: Optional[str], progress_bar: Progress,
                    attacks: Optional[Dict[str, Dict]] = None,
                    post_process_queue: int = DEFAULT_POST_PROCESS_QUEUE,
                    prefetch: int = DEFAULT_PREFETCH,
                    shift_roots: Optional[Dict[str, str]] = None):
    """Each cell's inference with its own dataloader (the dataset rebuilt per cell).

    Yields ``(cell, gathered results or None, the loop's metrics, dataset_meta, timing)``. Attack
    cells (of ``attacks``) read the clean images and attack them in the data preprocessor;
    real-world shift cells read their set (``shift_roots``: its family's root, else the default).
    ``post_process_queue``, ``prefetch``: of :class:`~.overlapped_loop.OverlappedTestLoop` (attack
    cells preprocess in the loop: their preprocessor attacks with the model).
    """
    if corrupted_root:  # NOTE: every sample's stored path, before the first cell's inference
        check_stored_leaves(cfg, corrupted_root, cells)
    counted = False
    for cell in cells:
        progress_bar.describe(cell_label(cell))
        attacked = is_attack_cell(cell[0])
        clean = cell[0] == CLEAN or attacked
        if is_shift_cell(cell[0]):
            loader = shift_dataloader(cfg, cell, shift_roots)
        else:
            loader = cell_dataloader(cfg, None if clean else cell[0], cell[1], seed, bgr_compat,
                                     corrupted_root)
        start = time.perf_counter()
        loop = InferenceLoop(runner, loader, metric_cfgs(cell)[0],
                             post_process_queue=post_process_queue,
                             prefetch=0 if attacked else prefetch)
        if is_shift_cell(cell[0]):  # NOTE: each shift set has its own size
            progress_bar.set_total(progress_bar.total + len(loop.dataloader.dataset))
        elif not counted:
            progress_bar.set_total(progress_bar.total + len(loop.dataloader.dataset)
                                   * sum(not is_shift_cell(c[0]) for c in cells))
            counted = True
        with ExitStack() as stack:
            if attacked:
                assert attacks
                stack.enter_context(attacking(runner, cfg, attack_of_cell(attacks, *cell)))
            parts = loop.run()
        progress_bar.update(len(loop.dataloader.dataset))
        timing = {'inference_s': round(time.perf_counter() - start, 3),
                  **loading_share(runner, len(loop.dataloader)),
                  'post_process_wait_s': round(loop.post_process.wait_s, 3)}
        yield cell, parts, loop.evaluator.metrics, loop.evaluator.dataset_meta, timing


@contextmanager
def attacking(runner, cfg: Config, attack) -> Iterator[None]:
    """The model's data preprocessor attacks every test batch within the block."""
    from ..models.data_preprocessors import PixelSpace
    from ..models.data_preprocessors.pixel_space import patched_forward
    model = unwrap_model(runner.model)
    late_gt = gt_at_file_scale(cfg)
    space = None

    def transform(data: dict, training: bool) -> dict:
        nonlocal space
        if training:
            return data
        if space is None:
            space = PixelSpace(model.data_preprocessor).to(data['inputs'].device)
        return attack_batch(model, data, attack, space, gt_at_file_scale=late_gt).data

    with patched_forward(model.data_preprocessor, transform):
        yield


def one_pass_cells(runner, cfg: Config, cells: List[Cell], evaluator_cfg: Any,
                    seed: int, bgr_compat: bool, corrupted_root: Optional[str],
                    progress_bar: Progress, post_process_queue: int = DEFAULT_POST_PROCESS_QUEUE,
                    prefetch: int = DEFAULT_PREFETCH):
    """Every cell's inference from one dataloader (:mod:`.one_pass`), the evaluator built once.

    Yields as :func:`per_cell_cells`. Raises ``OnePassUnsupported`` before any inference.
    """
    loader, per_cell = one_pass_loader(runner, cfg, cells, seed, bgr_compat, corrupted_root)
    images = loader.dataset.images
    _, world = get_dist_info()
    loop = OverlappedTestLoop(runner, loader, evaluator_cfg,
                              post_process_queue=post_process_queue, prefetch=prefetch)
    runner._test_loop = loop  # NOTE: hooks that ask runner.test_dataloader get this one, and
    # the runner does not build (and parse) the config's own test set besides
    progress_bar.set_total(images * len(cells))
    return _iterate_one_pass(runner, loop, cells, per_cell, images, world, progress_bar)


def _batch_size(item: Any) -> int:
    """Samples in a batch of :meth:`~.overlapped_loop.OverlappedTestLoop.batches`."""
    batch = item[0] if isinstance(item, tuple) else item
    return len(batch['inputs'])


def _iterate_one_pass(runner, loop, cells, per_cell: int, images: int, world: int,
                      progress_bar: Progress):
    """Cell by cell: this rank's ``per_cell`` batches of the cell, then every metric's gather.

    The gather runs on every rank, even one without a batch of the cell (``round_up=False`` with
    fewer images than ranks, ``drop_last``): the gather is a collective.
    """
    runner.call_hook('before_test')
    runner.call_hook('before_test_epoch')
    runner.model.eval()
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
    runner.call_hook('after_test_epoch', metrics={})
    runner.call_hook('after_test')
