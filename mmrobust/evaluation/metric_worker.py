"""A cell's metric computed beside the next cell's inference, in a process of its own.

The robustness loop runs a cell's inference with :class:`~.loop.InferenceLoop`
(mmengine's ``TestLoop`` up to and including each metric's per-batch ``process`` and the
gathering of its results to rank 0, without ``compute_metrics``). Rank 0 saves the gathered
results (:mod:`.predictions_file`) and hands the file to a :class:`MetricWorker`, a separate
process (Python's GIL would otherwise slow the loop), while every rank goes on with the next
cell. :func:`worker_imports` says, before any inference, what the worker must import to build
the config's metrics, and stops on a metric it cannot.
"""
import json
import multiprocessing.util as _multiprocessing_util
import os
import time
import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from mmengine.logging import print_log

from ..utils.errors import ConfigError, MMRobustError, shareable
from .predictions_file import load_cell_predictions

__all__ = ['DELAY_ENV', 'MetricClassError', 'MetricWorker', 'MetricWorkerError', 'WORKER_NAME',
           'WorkerDiedError', 'compute_metrics', 'worker_imports']

#: Test hook: seconds the metric worker sleeps before each cell (to kill a run mid-metric).
DELAY_ENV = 'MMROBUST_METRIC_WORKER_DELAY_S'
#: The metric worker's process name (``ps``, ``/proc/<pid>/comm``; Linux).
WORKER_NAME = 'mmrobust-metric'
#: Packages whose modules the fork server imports for the metric workers (a user's own module is
#: imported by each worker: an error in it must fail that run, not the server)
_PRELOADED = ('mmrobust', 'mmdet', 'mmseg', 'mmengine', 'mmcv', 'mmpretrain')


class MetricWorkerError(MMRobustError, RuntimeError):
    """The metric worker died, or its metric failed, while computing a cell.

    The message says where the cell's predictions are kept and that a rerun resumes from them (exit
    status 1; ``--debug`` shows the worker's error's traceback).
    """


class MetricClassError(ConfigError):
    """A metric whose class the metric worker cannot import (the message says what to do)."""


_BUILT: Dict[str, Any] = {}  # metric config (JSON) -> built metric, per process


def _metric(cfg: Mapping, scope: Optional[str]) -> Any:
    """The metric of ``cfg``, built once per process (a COCO metric parses its annotations once)."""
    from mmengine.registry import METRICS, init_default_scope
    key = json.dumps(cfg, sort_keys=True, default=str)
    if key not in _BUILT:  # NOTE: mmrobust's metrics are registered: this module's import
        # imported the mmrobust package first, in a fresh worker too
        if scope:
            init_default_scope(scope)
        _BUILT[key] = METRICS.build(dict(cfg))
    return _BUILT[key]


def compute_metrics(metrics: Sequence[Any], parts: Sequence[list],
                    dataset_meta: Optional[Mapping] = None) -> Dict[str, Any]:
    """The metrics of one cell from its gathered results (one list per metric).

    Named as ``Evaluator.evaluate`` names them (with each metric's ``prefix``); metrics asked for
    per-image statistics put their blocks under :data:`~.per_image.PER_IMAGE_KEY`.
    """
    from .per_image import PER_IMAGE_KEY
    out: Dict[str, Any] = {}
    blocks: List[Dict[str, Any]] = []
    for metric, results in zip(metrics, parts):
        if dataset_meta is not None:
            metric.dataset_meta = dict(dataset_meta)
        values = dict(metric.compute_metrics(results))
        for block in values.pop(PER_IMAGE_KEY, None) or []:
            if metric.prefix:  # NOTE: the names the block's numbers are recorded under
                block['metric_prefix'] = f'{metric.prefix}/{block["metric_prefix"]}'
            blocks.append(block)
        if metric.prefix:
            values = {f'{metric.prefix}/{k}': v for k, v in values.items()}
        clash = sorted(set(values) & set(out))
        if clash:
            raise ValueError(f'several metrics give {clash}: give the metrics different prefixes')
        out.update(values)
    if blocks:
        out[PER_IMAGE_KEY] = blocks
    return out


def _compute_file(path: str, metric_cfgs: Sequence[Mapping], scope: Optional[str],
                  stats: Optional[Any] = None) -> Tuple[Dict[str, Any], float, Dict[str, Any]]:
    """The worker's task: a cell's metrics from its predictions file.

    The seconds it took and the timing of the cell's inference saved with the predictions; the
    per-image statistics go to ``stats`` (a :class:`~.per_image.StatsTarget`) here, off the
    inference loop.
    """
    delay = float(os.environ.get(DELAY_ENV) or 0)
    if delay:
        time.sleep(delay)
    start = time.perf_counter()
    payload = load_cell_predictions(path)
    metrics = compute_metrics([_metric(cfg, scope) for cfg in metric_cfgs], payload['parts'],
                              payload['dataset_meta'])
    if stats is not None:
        from .per_image import write_cell_stats
        write_cell_stats(metrics, stats)
    return metrics, time.perf_counter() - start, payload['timing']


class WorkerDiedError(RuntimeError):
    """The metric worker process ended (killed, out of memory) with cells in its hands."""


def _worker_main(conn: Any, scope: Optional[str], imports: Sequence[str], parent: int,
                 environ: Mapping[str, str]) -> None:
    """The metric worker's loop: import what the metrics need, then compute the cells it is sent.

    The cells are computed in order, each answered with ``(seq, ok, result or error)``; ``None``
    ends it. The worker exits when ``parent`` (the loop's process, not the fork server) is gone,
    mid-metric too, and so do the processes its metrics fork (mmdet's ``COCOevalMP`` pool). It
    runs in ``environ``, the loop's environment when it asked for the worker (a fork server's
    own is that of its start).
    """
    import importlib

    from ..utils.processes import children_die_with_parent, exit_with_process, name_this_process
    exit_with_process(parent)
    name_this_process(WORKER_NAME)
    os.environ.clear()
    os.environ.update(environ)
    children_die_with_parent()
    try:  # NOTE: mmrobust's own metrics are registered (this module's package is imported)
        for module in imports:  # NOTE: the config's custom_imports (those that import here, see
            importlib.import_module(module)  # worker_imports) and the metrics' modules
    except BaseException as err:
        conn.send((-1, False, shareable(err)))
        return
    while True:
        try:
            message = conn.recv()
        except EOFError:  # NOTE: the loop's process ended
            return
        if message is None:
            return
        seq, args = message
        try:
            conn.send((seq, True, _compute_file(*args[:2], scope, *args[2:])))
        except BaseException as err:
            conn.send((seq, False, shareable(err)))


class _Job:
    """A cell handed to the :class:`MetricWorker`: ``done()`` and ``result()`` as a future's."""

    def __init__(self, worker: 'MetricWorker', seq: int) -> None:
        self.worker, self.seq = worker, seq

    def done(self) -> bool:
        self.worker._receive(block=False)
        return self.seq in self.worker._answers or self.worker._broken is not None

    def result(self) -> Tuple[Dict[str, Any], float, Dict[str, Any]]:
        while self.seq not in self.worker._answers:
            if self.worker._broken is not None:
                raise WorkerDiedError(self.worker._broken)
            self.worker._receive(block=True)
        ok, value = self.worker._answers.pop(self.seq)
        if not ok:
            raise value
        return value


def _context(imports: Sequence[str]) -> Any:
    """How metric workers start: from this process's fork server, or spawned where none exists.

    The fork server (multiprocessing's, one per process, started once) imports this module and
    the metrics' modules once; each worker is then a fork of that clean, single-threaded process
    and starts in milliseconds, where a spawned one imports mmdet anew (~4 s of CPU per run: what
    several runs in one process, a notebook, the test suite, paid every time). The preload takes
    effect when the server starts: one already started (by the corruption generator) serves
    workers that import what it lacks.
    """
    import multiprocessing
    if 'forkserver' not in multiprocessing.get_all_start_methods():  # NOTE: Windows
        return multiprocessing.get_context('spawn')
    context = multiprocessing.get_context('forkserver')
    context.set_forkserver_preload([__name__] + [
        m for m in imports if m.split('.')[0] in _PRELOADED and m != __name__])
    return context


class MetricWorker:
    """One process that computes cells' metrics from their predictions files, in order.

    ``submit`` returns a job whose ``result()`` is ``(metrics, seconds, inference timing)``
    computed by the metrics of ``metric_cfgs`` (built once per config in the worker). The
    process starts on the first submit, forked by this process's fork server (:func:`_context`:
    not a fork of this process, which may hold CUDA or torch threads) with this process's
    environment, and first imports ``imports`` (the config's ``custom_imports`` and the modules
    of the metrics' classes, :func:`worker_imports`), so a metric registered by a user module
    builds there too. It talks through one pipe and leaves no thread in this process (a
    ``ProcessPoolExecutor`` keeps two), so the dataloader workers forked afterwards start from
    a process without foreign threads. A worker that dies fails every job it held
    (:class:`WorkerDiedError`), so nothing waits on it.
    """

    def __init__(self, scope: Optional[str], imports: Sequence[str] = ()) -> None:
        self.scope, self.imports = scope, tuple(imports)
        self._proc: Any = None
        self._conn: Any = None
        self._seq = 0
        self._answers: Dict[int, Tuple[bool, Any]] = {}
        self._broken: Optional[str] = None

    def submit(self, path: str, metric_cfgs: Sequence[Mapping], stats: Optional[Any] = None
               ) -> _Job:
        """Queue a cell's predictions file for its metrics."""
        if self._broken is not None:
            raise WorkerDiedError(self._broken)
        if self._proc is None:
            context = _context(self.imports)
            self._conn, child = context.Pipe()
            # NOTE: not a daemon: a daemon may not start processes, and mmdet's COCOevalMP
            # (--coco-backend mmdet-mp) starts a pool. It is stopped before multiprocessing's
            # exit handler joins its children, and it exits by itself when this process dies.
            self._proc = context.Process(target=_worker_main, name='mmrobust-metric-worker',
                                         args=(child, self.scope, self.imports, os.getpid(),
                                               dict(os.environ)),
                                         daemon=False)
            self._proc.start()
            _LIVE_WORKERS.add(self)
            child.close()  # NOTE: so the worker's end closing reaches this end as EOF
        self._seq += 1
        try:
            self._conn.send((self._seq, (path, [dict(c) for c in metric_cfgs], stats)))
        except OSError as err:
            self._died(f'the metric worker cannot be reached ({err})')
            raise WorkerDiedError(self._broken) from None
        return _Job(self, self._seq)

    def _died(self, why: str) -> None:
        code = self._proc.exitcode if self._proc is not None else None
        self._broken = f'{why}; exit code {code}' if code is not None else why

    def wait(self, timeout: float) -> None:
        """Take the answers that arrived, waiting at most ``timeout`` seconds for one."""
        if self._conn is not None and self._broken is None and self._conn.poll(timeout):
            self._receive(block=False)

    def _receive(self, block: bool) -> None:
        """Take the answers that arrived (``block``: wait for one)."""
        if self._conn is None or self._broken is not None:
            return
        try:
            while block or self._conn.poll():
                seq, ok, value = self._conn.recv()
                if seq == -1:  # NOTE: its imports failed: every cell would fail alike
                    self._died(f'the metric worker could not import what the metrics need '
                               f'({type(value).__name__}: {value})')
                    return
                self._answers[seq] = (ok, value)
                block = False
        except (EOFError, OSError):
            self._died('the metric worker died')

    def close(self, cancel: bool = False) -> None:
        """Stop the process (``cancel``: at once, without finishing queued cells)."""
        if self._proc is None:
            return
        if cancel:
            self._proc.terminate()  # NOTE: a stop mid-metric must not wait for the metric
        else:
            try:
                self._conn.send(None)
            except OSError:
                pass
        self._proc.join(30)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()
        self._proc = self._conn = None
        _LIVE_WORKERS.discard(self)


_LIVE_WORKERS: 'weakref.WeakSet[MetricWorker]' = weakref.WeakSet()


def _stop_live_workers() -> None:
    """At exit, before multiprocessing joins its (non-daemon) children: stop the workers left."""
    for worker in list(_LIVE_WORKERS):
        worker.close(cancel=True)


# NOTE: multiprocessing's exit handler runs finalizers of priority >= 0 before it joins the
# non-daemon children; a worker no one closed (an error path that missed it) would be joined
# forever otherwise
_multiprocessing_util.Finalize(None, _stop_live_workers, exitpriority=10)


def _importable(module: str) -> bool:
    """Whether a fresh process can find ``module`` (by its spec, as the worker's import will)."""
    import importlib.util
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def worker_imports(evaluator_cfg: Any, custom_imports: Optional[Mapping], scope: Optional[str]
                   ) -> List[str]:
    """What the metric worker imports before building the metrics, checked before inference.

    The config's ``custom_imports`` and the module of each metric's class (found here, where the
    config's imports ran). Each custom import is imported here first, as mmengine does: under
    ``allow_failed_imports=True`` one that fails is left out (logged), as mmengine leaves it out;
    without it, it stops the run now, not after the first cells' inference.

    Raises:
        MetricClassError: a metric's class lives where a fresh process cannot import it (a
            script's ``__main__``, a file loaded by path); says what to do.
        ConfigError: a custom import that fails, and failed imports are not allowed.
    """
    import importlib

    from mmengine.registry import METRICS

    from .evaluator_cfg import metric_entries
    custom = dict(custom_imports or {})
    names = custom.get('imports') or []
    names = [names] if isinstance(names, str) else list(names)
    modules: List[str] = []
    for module in names:
        try:
            importlib.import_module(module)  # NOTE: a no-op for what the config's load imported
        except ImportError as err:
            if not custom.get('allow_failed_imports', False):
                raise ConfigError(
                    f'the config\'s custom_imports names {module!r}, which cannot be imported '
                    f'({err}). Install it or put it on PYTHONPATH, remove it from '
                    'custom_imports, or set allow_failed_imports=True to run without it.'
                ) from None
            print_log(f'custom import {module!r} failed ({err}) and is ignored '
                      '(allow_failed_imports=True): the metric worker does not import it either',
                      logger='current', level=30)
            continue
        modules.append(module)
    for entry in metric_entries(evaluator_cfg):
        kind = entry.get('type')
        with METRICS.switch_scope_and_registry(scope) as registry:  # NOTE: as build() finds it
            cls = kind if isinstance(kind, type) else registry.get(kind)
        if cls is None:
            continue  # NOTE: the loop's own build names what is unknown, before inference
        module = cls.__module__
        if module == '__main__' or not _importable(module):
            raise MetricClassError(
                f'the metric {cls.__name__} is defined in {module!r}, which the metric worker '
                '(a fresh process) cannot import. Define it in an importable module and list '
                'that module in the config\'s custom_imports, or compute the metrics in this '
                'process with --metric-queue 0.')
        modules.append(module)
    return list(dict.fromkeys(modules))
