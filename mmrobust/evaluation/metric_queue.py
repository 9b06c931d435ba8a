"""Rank 0's queue of cells' metrics: each cell's metric computed and recorded, in order.

With depth K > 0 a cell's predictions are saved
(:func:`~.predictions_file.save_cell_predictions`) and its metric is computed by a
:class:`~.metric_worker.MetricWorker` process while the next cells infer,
at most K cells in flight (the loop waits when the worker falls behind); K = 0 is the
serial case of the same queue: each cell's metric right after its inference, in this process.
A cell is recorded in the results file (and its per-image statistics written) when its metric
is done, oldest first; its saved predictions are removed only then.

Every step that may wait is a generator that yields each time it has waited up to ``poll_s``
without finishing, so the other ranks wait in short broadcasts
(:func:`~.rank0.rank0_until_done`), not in a collective that could time out. The loop calls
the steps through :class:`RankedQueue`, on every rank, which drives that waiting itself.
"""
import os
import os.path as osp
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

from mmengine.logging import print_log

from .cell_kinds import Cell, kind_of
from .evaluator_cfg import FILE_WRITING_METRICS
from .metric_worker import MetricWorker, MetricWorkerError, WorkerDiedError, compute_metrics
from .metrics import is_main_metric
from .per_image import StatsTarget, write_cell_stats
from .predictions_file import (
    PredictionsPicklingError,
    load_cell_predictions,
    predictions_path,
    save_cell_predictions,
)
from .rank0 import rank0_until_done
from .results import RobustnessResults, identity_sha256

__all__ = ['MetricQueue', 'RankedQueue', 'cell_label', 'in_thread', 'numeric']


def numeric(metrics: Dict) -> Dict[str, float]:
    """The scalar metrics (what P_clean / mPC / rPC are computed from)."""
    out = {}
    for key, value in metrics.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue  # NOTE: e.g. mmdet's per-class tables
    return out


def cell_label(cell: Cell) -> str:
    """``fog 3``, or ``clean``: as the cell's kind names it."""
    return kind_of(cell[0]).label(cell)


def in_thread(fn: Any, poll_s: float, *args: Any) -> Iterator[None]:
    """``fn(*args)`` in a thread, yielding every ``poll_s`` until it ends.

    Returns its value (or raises its error). The thread has ended when this returns, so no
    dataloader forks beside it.
    """
    outcome: Dict[str, Any] = {}

    def run() -> None:
        try:
            outcome['value'] = fn(*args)
        except BaseException as err:  # NOTE: raised below, in the loop's thread
            outcome['error'] = err
    thread = threading.Thread(target=run, name='mmrobust-rank0-step', daemon=True)
    thread.start()
    while True:
        thread.join(poll_s)
        if not thread.is_alive():
            break
        yield
    if 'error' in outcome:
        raise outcome['error']
    return outcome.get('value')


@dataclass
class _InFlight:
    cell: Cell
    path: str
    future: Any  # a MetricWorker job: done(), result()
    timing: Dict[str, Any]


class MetricQueue:
    """Rank 0's cells' metrics, in order (see the module's docstring).

    Args:
        runner: builds a cell's evaluator when a saved cell is resumed serially.
        results: the results file the cells are recorded in.
        depth: K, the cells in flight in the worker; 0: serial.
        folder: where predictions are saved for the worker (``<stem>_predictions``).
        metric_cfgs: a cell's evaluator config and its metric configs.
        stats_target: where a cell's per-image statistics go (None: not kept).
        backends: the COCO backends, recorded in each cell's timing.
        scope, imports: the worker's default scope and the modules it imports.
        poll_s: the longest wait between two yields.
    """

    def __init__(self, runner: Any, results: RobustnessResults, depth: int, folder: str,
                 metric_cfgs: Callable[[Cell], Tuple[Any, List[Dict]]],
                 stats_target: Callable[[Cell], Optional[StatsTarget]],
                 backends: Sequence[str], scope: Optional[str], imports: Sequence[str],
                 poll_s: float) -> None:
        if depth < 0:
            raise ValueError(f'metric_queue must be 0 (serial) or more, got {depth}')
        self.runner, self.results, self.depth, self.folder = runner, results, depth, folder
        self.metric_cfgs, self.stats_target = metric_cfgs, stats_target
        self.backends, self.poll_s = list(backends), poll_s
        self.worker = MetricWorker(scope, list(imports)) if depth else None
        self.in_flight: Deque[_InFlight] = deque()

    # -- the steps the loop names ------------------------------------------------------------------
    def finish(self, cell: Cell, parts: List[list], metrics_of_loop: List[Any],
               dataset_meta: Optional[Dict], timing: Dict) -> Iterator[None]:
        """After a cell's inference: its metric now (serial) or handed to the worker."""
        if self.worker is None:
            yield from self._compute_here(cell, parts, metrics_of_loop, timing)
            return
        path = predictions_path(self.folder, *cell)
        start = time.perf_counter()
        try:
            yield from in_thread(save_cell_predictions, self.poll_s, path,
                                 identity_sha256(self.results.identity), *cell, parts,
                                 dataset_meta, timing)
        except PredictionsPicklingError as err:
            print_log(f'{cell_label(cell)}: a metric keeps what a predictions file does not '
                      f'hold ({err}); this cell\'s metric is computed here, right after its '
                      'inference (not beside the next cells; a killed run infers it again)',
                      logger='current', level=30)
            yield from self._compute_here(cell, parts, metrics_of_loop, timing)
            return
        timing['save_s'] = round(time.perf_counter() - start, 3)
        yield from self._hand_over(cell, path, timing)

    def resume_saved(self, cell: Cell, path: str) -> Iterator[None]:
        """A killed run's cell, from its saved predictions."""
        if self.worker is not None:
            yield from self._hand_over(cell, path, {'resumed_from_predictions': True})
            return
        start = time.perf_counter()
        payload = load_cell_predictions(path)
        built = self.runner.build_evaluator(self.metric_cfgs(cell)[0]).metrics
        metrics = yield from in_thread(compute_metrics, self.poll_s, built, payload['parts'],
                                       payload['dataset_meta'])
        seconds = round(time.perf_counter() - start, 3)
        self._record(cell, metrics, {**payload['timing'], 'resumed_from_predictions': True,
                                     'metric_s': seconds, 'wait_s': seconds}, path)

    def drain(self) -> Iterator[None]:
        """Every metric in flight recorded."""
        self._settle(block=False)
        while self.in_flight:
            self._wait_for_oldest()
            self._settle(block=False)
            if self.in_flight:
                yield

    def close(self, cancel: bool = False) -> None:
        """Stop the worker (``cancel``: without waiting for its jobs)."""
        if self.worker is not None:
            self.worker.close(cancel=cancel)

    # -- inside ------------------------------------------------------------------------------------
    def _record(self, cell: Cell, metrics: Dict, timing: Dict, path: Optional[str]) -> None:
        if self.backends:
            timing['metric_backend'] = ', '.join(self.backends)
        # NOTE: this run's seconds on the cell: its inference and the wait for its metric
        timing['wall_s'] = round((0.0 if timing.get('resumed_from_predictions') else
                                  timing.get('inference_s', 0.0)) + timing['wait_s'], 3)
        target = self.stats_target(cell)
        if target is not None:  # NOTE: before the cell is recorded: a recorded cell has its file
            write_cell_stats(metrics, target)  # (the worker's metrics have none left)
        self.results.record(*cell, numeric(metrics), timing)
        if path and osp.exists(path):
            os.remove(path)  # NOTE: only once the metrics are in the results file
        shown = ', '.join(f'{k}: {v:.4f}' for k, v in numeric(metrics).items()
                          if is_main_metric(k))
        print_log(f'{cell[0]} {cell[1]}: {shown or "recorded"} (metric {timing["metric_s"]} s, '
                  f'the loop waited {timing["wait_s"]} s)', logger='current')

    def _compute_here(self, cell: Cell, parts: List[list], metrics_of_loop: List[Any],
                      timing: Dict) -> Iterator[None]:
        """The cell's metric in this process, by the loop's own metrics."""
        start = time.perf_counter()
        for metric, entry in zip(metrics_of_loop, self.metric_cfgs(cell)[1]):
            if type(metric).__name__ in FILE_WRITING_METRICS:
                continue  # NOTE: built for this cell alone (mmdet's keeps <prefix>/results)
            for key in ('out_file_path', 'outfile_prefix'):  # NOTE: the one-pass loop's
                if entry.get(key):  # metrics serve every cell; these are the cell's own
                    setattr(metric, key, entry[key])
        metrics = yield from in_thread(compute_metrics, self.poll_s, metrics_of_loop, parts)
        timing['metric_s'] = timing['wait_s'] = round(time.perf_counter() - start, 3)
        self._record(cell, metrics, timing, None)

    def _settle(self, block: bool) -> None:
        """Record the finished metrics in order; ``block``: wait for the oldest one."""
        while self.in_flight and (block or self.in_flight[0].future.done()):
            job = self.in_flight.popleft()
            start = time.perf_counter()
            try:
                metrics, seconds, saved_timing = job.future.result()
            except WorkerDiedError as err:
                raise MetricWorkerError(
                    f'the metric worker died while computing the metrics of cell {job.cell[0]} '
                    f'{job.cell[1]} ({err}); its predictions are kept in {job.path}. Rerun the '
                    'same command: it resumes and computes the metric of that cell from them, '
                    'without inference.') from err
            except Exception as err:
                raise MetricWorkerError(
                    f'the metric of cell {job.cell[0]} {job.cell[1]} failed in the metric worker '
                    f'({type(err).__name__}: {err}); its predictions are kept in {job.path}, '
                    'and a rerun computes the metric from them.') from err
            job.timing = {**saved_timing, **job.timing, 'metric_s': round(seconds, 3)}
            job.timing['wait_s'] = round(job.timing.get('wait_s', 0.0)
                                         + time.perf_counter() - start, 3)
            self._record(job.cell, metrics, job.timing, job.path)
            block = False

    def _wait_for_oldest(self) -> None:
        """At most ``poll_s`` for the oldest cell in flight, counted as that cell's wait."""
        assert self.worker is not None
        start = time.perf_counter()
        self.worker.wait(self.poll_s)
        oldest = self.in_flight[0].timing
        oldest['wait_s'] = round(oldest.get('wait_s', 0.0) + time.perf_counter() - start, 3)

    def _hand_over(self, cell: Cell, path: str, timing: Dict) -> Iterator[None]:
        """Queue a cell's saved predictions for the worker; yields while K are in flight."""
        assert self.worker is not None
        self._settle(block=False)
        while len(self.in_flight) >= self.depth:
            self._wait_for_oldest()
            self._settle(block=False)
            if len(self.in_flight) >= self.depth:
                yield
        try:
            future = self.worker.submit(path, self.metric_cfgs(cell)[1], self.stats_target(cell))
        except WorkerDiedError as err:
            while self.in_flight:  # NOTE: names the cell the worker held when it died
                self._settle(block=True)
            raise MetricWorkerError(
                f'the metric worker died before it took cell {cell[0]} {cell[1]} ({err}); its '
                f'predictions are kept in {path}. Rerun the same command: it resumes from them '
                'without inference.') from None
        self.in_flight.append(_InFlight(cell, path, future, timing))


class RankedQueue:
    """Every rank's handle on rank 0's :class:`MetricQueue` (None on the other ranks).

    Each step runs rank 0's generator to its end while the other ranks wait in short broadcasts
    (:func:`~.rank0.rank0_until_done`), and raises rank 0's error on every rank: the loop calls
    steps, not generators. Call them on every rank, between two cells.
    """

    def __init__(self, queue: Optional[MetricQueue]) -> None:
        self.queue = queue

    def finish(self, cell: Cell, parts: Any, metrics_of_loop: List[Any],
               dataset_meta: Optional[Dict], timing: Dict) -> None:
        """:meth:`MetricQueue.finish`, on every rank."""
        rank0_until_done(None if self.queue is None else self.queue.finish(
            cell, parts, metrics_of_loop, dataset_meta, timing))

    def resume_saved(self, cell: Cell, path: str) -> None:
        """:meth:`MetricQueue.resume_saved`, on every rank."""
        rank0_until_done(None if self.queue is None else self.queue.resume_saved(cell, path))

    def drain(self) -> None:
        """:meth:`MetricQueue.drain`, on every rank."""
        rank0_until_done(None if self.queue is None else self.queue.drain())

    def close(self, cancel: bool = False) -> None:
        """Stop rank 0's worker (``cancel``: without waiting for its jobs)."""
        if self.queue is not None:
            self.queue.close(cancel)
