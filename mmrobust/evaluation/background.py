"""A cell's metric computed beside the next cell's inference, from predictions saved on disk.

The robustness loop (:func:`~mmrobust.evaluation.robustness.evaluate_robustness`) runs a cell's
inference with :class:`InferenceLoop`: mmengine's ``TestLoop`` up to and including each metric's
per-batch ``process`` and the gathering of its results to rank 0, but without the metric's
``compute_metrics``. Rank 0 writes the gathered results to a predictions file next to the results
file (atomically) and hands the file to a :class:`MetricWorker`, a separate process (Python's GIL
would otherwise slow the loop), while every rank goes on with the next cell. The file is removed
only after the cell's metrics are in the results file, so a run killed during a metric resumes
from it without inference.
"""
import json
import multiprocessing.util as _multiprocessing_util
import os
import os.path as osp
import pickle
import time
import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from mmengine.dist import collect_results, get_dist_info
from mmengine.evaluator.metric import _to_cpu
from mmengine.logging import print_log
from typing_extensions import override

from ..utils.errors import ConfigError, MMRobustError, shareable
from ..utils.io import TMP_MARK, atomic_write
from .overlapped_loop import OverlappedTestLoop
from .results import ResultsLayout

__all__ = ['PREDICTIONS_FORMAT', 'InferenceLoop', 'MetricClassError', 'MetricWorker',
           'PredictionsPicklingError',
           'MetricWorkerError', 'WorkerDiedError', 'worker_imports',
           'compute_metrics', 'gather_parts', 'load_cell_predictions', 'predictions_dir',
           'predictions_path', 'read_predictions_header', 'save_cell_predictions', 'saved_cells']

PREDICTIONS_FORMAT = 'mmrobust-cell-predictions/2'
#: Test hook: seconds the metric worker sleeps before each cell (to kill a run mid-metric).
DELAY_ENV = 'MMROBUST_METRIC_WORKER_DELAY_S'


class MetricWorkerError(MMRobustError, RuntimeError):
    """The metric worker died, or its metric failed, while computing a cell.

    The message says where the cell's predictions are kept and that a rerun resumes from them (exit
    status 1; ``--debug`` shows the worker's error's traceback).
    """


class MetricClassError(ConfigError):
    """A metric whose class the metric worker cannot import (the message says what to do)."""


# -- inference without the metric's computation ----------------------------------------------------

class InferenceLoop(OverlappedTestLoop):
    """mmengine's ``TestLoop`` whose :meth:`run` stops before ``compute_metrics``.

    Every rank runs the batches and each metric's ``process`` (as ``TestLoop`` does, in the
    post-processing thread of :class:`~.overlapped_loop.OverlappedTestLoop`), then each metric's
    results are gathered to rank 0 (``collect_results``, every rank takes part).

    Returns (from :meth:`run`): on rank 0 the gathered results, one list per metric of the
    evaluator, in order; ``None`` on the other ranks.
    """

    @override
    def run(self) -> Optional[List[list]]:  # type: ignore[override]
        self.runner.call_hook('before_test')
        self.runner.call_hook('before_test_epoch')
        self.runner.model.eval()
        self.test_loss.clear()
        try:
            for idx, item in enumerate(self.batches()):
                self.run_iter(idx, item)
            self.finish_batches()
        finally:
            self.close(cancel=True)  # NOTE: finished, or stopping on an error
        size = len(self.dataloader.dataset)
        parts = [gather_parts(metric, size) for metric in self.evaluator.metrics]
        # NOTE: the metrics are logged when they are recorded, maybe a cell later
        self.runner.call_hook('after_test_epoch', metrics={})
        self.runner.call_hook('after_test')
        return parts if get_dist_info()[0] == 0 else None


def gather_parts(metric: Any, size: int) -> Optional[list]:
    """``BaseMetric.evaluate`` up to ``compute_metrics``: the results of every rank on rank 0."""
    if not metric.results:
        print_log(f'{type(metric).__name__} got no results from `process`.', logger='current',
                  level=30)
    if metric.collect_device == 'cpu':
        results = collect_results(metric.results, size, 'cpu', tmpdir=metric.collect_dir)
    else:
        results = collect_results(metric.results, size, metric.collect_device)
    metric.results.clear()
    return _to_cpu(results) if get_dist_info()[0] == 0 else None


# -- the predictions of a cell on disk -------------------------------------------------------------

def predictions_dir(results_path: str) -> str:
    """``<results stem>_predictions/`` next to the results file.

    The cells whose metrics are not recorded yet.
    """
    return ResultsLayout(results_path).predictions


def predictions_path(folder: str, corruption: str, severity: int) -> str:
    """Where a cell's predictions file lives in ``folder``."""
    return ResultsLayout.cell_file(folder, corruption, severity, 'pkl')


#: Modules whose classes are data containers a metric may keep in its results (OpenMMLab's
#: data elements and mask structures): built by ``__new__`` and a ``__dict__`` update, no code.
DATA_STRUCTURE_MODULES = ('mmengine.structures.', 'mmdet.structures.', 'mmseg.structures.')
_ALLOWED: Dict[str, Any] = {}


def _allowed(module: str, name: str) -> Any:
    """The global ``module.name`` if a predictions file may name it, else None."""
    if not _ALLOWED:
        from ..utils.checkpoint import data_globals
        _ALLOWED.update(data_globals())
    full = f'{module}.{name}'
    if full in _ALLOWED:
        return _ALLOWED[full]
    if module.startswith(DATA_STRUCTURE_MODULES) and '.' not in name:
        import importlib
        found = getattr(importlib.import_module(module), name, None)
        if isinstance(found, type):
            return found
    return None


class PredictionsPicklingError(pickle.PicklingError):
    """A metric keeps an object a predictions file may not hold (the message names it)."""


class _PredictionsPickler(pickle.Pickler):
    """Pickles tensors as numpy arrays (by persistent id).

    A predictions file needs no torch storage unpickling, which runs ``torch.load`` on bytes from
    the file. Any other object must be one the loader accepts, checked here, before the file is
    written.
    """

    def persistent_id(self, obj: Any) -> Any:
        import torch
        if isinstance(obj, torch.Tensor):
            tensor = obj.detach().cpu()
            if tensor.dtype == torch.bfloat16:  # NOTE: numpy has no bfloat16
                return ('tensor', 'bfloat16', tensor.view(torch.int16).numpy())
            return ('tensor', None, tensor.numpy())
        return None

    def reducer_override(self, obj: Any) -> Any:
        import numpy as np
        import torch
        if isinstance(obj, (np.ndarray, np.generic, np.dtype, torch.dtype, torch.device,
                            torch.Size)):
            return NotImplemented
        named = obj if isinstance(obj, type) or callable(obj) else type(obj)
        module = getattr(named, '__module__', None) or ''
        name = getattr(named, '__qualname__', getattr(named, '__name__', ''))
        if _allowed(module, name) is None:
            raise PredictionsPicklingError(
                f'{module}.{name} is not allowed in a predictions file (only numbers, arrays, '
                'tensors, containers and OpenMMLab data structures are)')
        return NotImplemented


class _PredictionsUnpickler(pickle.Unpickler):
    """Loads a predictions file's payload.

    The allow-listed globals only (anything else is an ``UnpicklingError`` that names it), tensors
    from their arrays.
    """

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed(module, name)
        if found is None:
            raise pickle.UnpicklingError(
                f'{module}.{name} is not allowed in a predictions file (only numbers, arrays, '
                'tensors, containers and OpenMMLab data structures are)')
        return found

    def persistent_load(self, pid: Any) -> Any:
        import torch
        kind, dtype, array = pid
        if kind != 'tensor':
            raise pickle.UnpicklingError(f'unknown persistent id {kind!r}')
        if not array.flags.writeable:
            array = array.copy()
        tensor = torch.from_numpy(array)
        return tensor.view(torch.bfloat16) if dtype == 'bfloat16' else tensor


def save_cell_predictions(path: str, identity_sha256: str, corruption: str, severity: int,
                          parts: Sequence[list], dataset_meta: Optional[Mapping],
                          timing: Mapping) -> None:
    """Write a cell's gathered metric inputs atomically (flushed to disk before it is used).

    A one-line header (:func:`read_predictions_header`), then the payload.
    """
    header = {'format': PREDICTIONS_FORMAT, 'identity_sha256': identity_sha256,
              'cell': [corruption, int(severity)]}
    payload = {'parts': list(parts), 'dataset_meta': dict(dataset_meta or {}),
               'timing': dict(timing)}
    with atomic_write(path, 'wb') as f:
        f.write(json.dumps(header).encode() + b'\n')
        # NOTE: protocol 4: numpy arrays through _reconstruct, which the allow-list has
        _PredictionsPickler(f, protocol=4).dump(payload)


def read_predictions_header(path: str) -> Dict[str, Any]:
    """The header of a predictions file (format, identity fingerprint, cell).

    Read without unpickling anything.

    Raises:
        ValueError: not a predictions file of :data:`PREDICTIONS_FORMAT` (e.g. an earlier
            mmrobust's, in the general pickle format).
    """
    with open(path, 'rb') as f:
        line = f.readline(1 << 16)
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get('format') != PREDICTIONS_FORMAT:
        raise ValueError(f'{path} is not a predictions file of {PREDICTIONS_FORMAT} (an '
                         'earlier mmrobust\'s, or another file)')
    return header


def load_cell_predictions(path: str) -> Dict:
    """A predictions file this package wrote, as a dict (the header's keys and the payload's).

    Loaded by a restricted unpickler.

    Raises:
        ValueError: not a predictions file of :data:`PREDICTIONS_FORMAT`.
        pickle.UnpicklingError: the payload names anything but numbers, arrays, tensors and
            containers (nothing of it ran).
    """
    header = read_predictions_header(path)
    with open(path, 'rb') as f:
        f.readline(1 << 16)
        payload = _PredictionsUnpickler(f).load()
    if not isinstance(payload, dict) or 'parts' not in payload:
        raise ValueError(f'{path} holds no predictions payload')
    return {**header, **payload}


def saved_cells(folder: str, identity_sha256: str,
                planned: Optional[Sequence[Tuple[str, int]]] = None
                ) -> Tuple[Dict[Tuple[str, int], str], List[str]]:
    """The predictions files in ``folder``, from their headers alone.

    ``({(corruption, severity): path}, unused)``, where ``unused`` lists files that must not be
    used: of another evaluation, unreadable, or of a cell that is not in ``planned`` (orphans); the
    log says why for each.
    """
    found: Dict[Tuple[str, int], str] = {}
    unused: List[str] = []
    if not osp.isdir(folder):
        return found, unused
    wanted = None if planned is None else {(c, int(s)) for c, s in planned}
    for name in sorted(os.listdir(folder)):
        path = osp.join(folder, name)
        if TMP_MARK in name or not name.endswith('.pkl'):
            continue
        try:
            header = read_predictions_header(path)
        except (OSError, ValueError) as err:
            print_log(f'{path} cannot be used ({err}); its cell is inferred again',
                      logger='current', level=30)
            unused.append(path)
            continue
        if header['identity_sha256'] != identity_sha256:
            print_log(f'{path}: predictions of another evaluation', logger='current', level=30)
            unused.append(path)
            continue
        corruption, severity = header['cell']
        cell = (corruption, int(severity))
        if wanted is not None and cell not in wanted:
            print_log(f'{path}: predictions of cell {cell[0]} {cell[1]}, which this evaluation '
                      'does not plan (an orphan)', logger='current', level=30)
            unused.append(path)
            continue
        found[cell] = path
    return found, unused


# -- computing the metrics -------------------------------------------------------------------------

_BUILT: Dict[str, Any] = {}  # metric config (JSON) -> built metric, per process


def _metric(cfg: Mapping, scope: Optional[str]) -> Any:
    """The metric of ``cfg``, built once per process (a COCO metric parses its annotations once)."""
    from mmengine.registry import METRICS, init_default_scope
    key = json.dumps(cfg, sort_keys=True, default=str)
    if key not in _BUILT:
        import mmrobust  # noqa: F401  (registers mmrobust's metrics in a fresh worker)
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


def _worker_main(conn: Any, scope: Optional[str], imports: Sequence[str], parent: int) -> None:
    """The metric worker's loop: import what the metrics need, then compute the cells it is sent.

    The cells are computed in order, each answered with ``(seq, ok, result or error)``; ``None``
    ends it. The worker exits when ``parent`` (the loop's process) is gone, mid-metric too, and so
    do the processes its metrics fork (mmdet's ``COCOevalMP`` pool).
    """
    import importlib

    from ..utils.processes import children_die_with_parent, exit_with_parent
    exit_with_parent(parent)
    children_die_with_parent()
    try:
        import mmrobust  # noqa: F401  (registers mmrobust's metrics in a fresh worker)
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


class MetricWorker:
    """One process that computes cells' metrics from their predictions files, in order.

    ``submit`` returns a job whose ``result()`` is ``(metrics, seconds, inference timing)``
    computed by the metrics of ``metric_cfgs`` (built once per config in the worker). The
    process starts on the first submit (``spawn``: no fork of a process holding CUDA or torch
    threads) and first imports ``imports`` (the config's ``custom_imports`` and the modules of
    the metrics' classes, :func:`worker_imports`), so a metric registered by a user module
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
            import multiprocessing
            context = multiprocessing.get_context('spawn')
            self._conn, child = context.Pipe()
            # NOTE: not a daemon: a daemon may not start processes, and mmdet's COCOevalMP
            # (--coco-backend mmdet-mp) starts a pool. It is stopped before multiprocessing's
            # exit handler joins its children, and it exits by itself when this process dies.
            self._proc = context.Process(target=_worker_main, name='mmrobust-metric-worker',
                                         args=(child, self.scope, self.imports, os.getpid()),
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

    from .coco_metric import metric_entries
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
