"""Corruption-robustness evaluation of any mmdet / mmseg config: every cell, one model, resumable.

``evaluate_robustness`` evaluates the clean test set and each (corruption, severity) cell of a
protocol with a runner whose model and checkpoint are loaded once. A cell's images are corrupted
on the fly (the ``Corrupt`` transform right after the image-loading step, in the dataloader
workers) or read from a corrupted copy written by ``tools/make_corrupted.py``. After every cell
the results file is rewritten atomically; a rerun with the same identity skips finished cells.
"""
import copy
import hashlib
import json
import os.path as osp
import time
from contextlib import ExitStack, contextmanager
from typing import Dict, Iterator, List, Optional

from mmengine.config import Config, ConfigDict
from mmengine.dist import barrier, broadcast_object_list, get_dist_info
from mmengine.logging import print_log

from ..corruptions import Protocol
from ..utils.config_checks import leaf_datasets
from ..utils.io import FileLockedError, ResultsStore, exclusive_lock
from ..version import __version__
from .coco_metric import DEFAULT_ROBUSTNESS_BACKEND, select_coco_backend, without_backend
from .metrics import CLEAN
from .seg_metric import use_fast_iou

RESULTS_FORMAT = 'mmrobust-robustness/1'
# the keys that must match for a results file to be resumed
IDENTITY_KEYS = ('protocol', 'cells_planned', 'seed', 'bgr_compat', 'source', 'config_sha256',
                 'checkpoint_sha256')


class PipelineError(ValueError):
    """The test pipeline cannot be corrupted (no image-loading step)."""


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


# dataloader settings that do not change what is evaluated (a resumed run may change them)
_LOADER_RUNTIME_KEYS = ('num_workers', 'persistent_workers', 'pin_memory', 'prefetch_factor')


def config_sha256(cfg: Config) -> str:
    """Fingerprint of what a config evaluates: model, test data and evaluator."""
    loader = {k: v for k, v in dict(cfg.get('test_dataloader') or {}).items()
              if k not in _LOADER_RUNTIME_KEYS}
    parts = {'test_dataloader': loader,
             'test_evaluator': without_backend(cfg.get('test_evaluator')),
             **{k: cfg.get(k) for k in ('model', 'test_cfg')}}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


# -- pipelines and dataloaders per cell ------------------------------------------------------------

def find_loading_step(pipeline: List[Dict]) -> int:
    """Index of the image-loading transform (``LoadImageFromFile`` and kin), found by type."""
    for i, step in enumerate(pipeline):
        kind = step.get('type', '') if isinstance(step, dict) else type(step).__name__
        kind = kind if isinstance(kind, str) else getattr(kind, '__name__', '')
        if kind.split('.')[-1].startswith('LoadImageFrom'):
            return i
    types = [s.get('type') if isinstance(s, dict) else type(s).__name__ for s in pipeline]
    raise PipelineError(
        f'The test pipeline has no image-loading step (LoadImageFromFile or similar), so there '
        f'is no place to corrupt the images: {types}. Add one, or evaluate a stored corrupted '
        'set with --corrupted-root.')


def cell_dataloader(cfg: Config, corruption: Optional[str], severity: int, seed: int,
                    bgr_compat: bool, corrupted_root: Optional[str]) -> ConfigDict:
    """The test dataloader config of one cell (``corruption=None``: the clean set)."""
    loader = copy.deepcopy(cfg.test_dataloader)
    if corruption is None:
        return loader
    for dataset in leaf_datasets(loader['dataset']):
        if corrupted_root:
            dataset['data_root'] = osp.join(corrupted_root, corruption, str(severity))
            if not osp.isdir(dataset['data_root']):
                raise FileNotFoundError(
                    f'{dataset["data_root"]} does not exist: write the corrupted set with '
                    f'`python tools/make_corrupted.py SRC {corrupted_root} ...` for this '
                    'protocol, or drop --corrupted-root to corrupt on the fly.')
            continue
        pipeline = list(dataset['pipeline'])
        at = find_loading_step(pipeline)
        pipeline.insert(at + 1, dict(type='Corrupt', corruption=corruption, severity=severity,
                                     seed=seed, bgr_compat=bgr_compat))
        dataset['pipeline'] = pipeline
    return loader


# -- the results file ------------------------------------------------------------------------------

def report_dir(results_path: str) -> str:
    """Where the tables and plots of a results file go: ``<results stem>_report/`` next to it,
    so two results files in one folder keep their own."""
    stem = osp.splitext(osp.abspath(results_path))[0]
    return f'{stem}_report'


@contextmanager
def results_lock(path: str, wait: bool = False) -> Iterator[None]:
    """One writer per results file: rank 0 holds its lock for the with-block.

    A second run on the same file stops with who holds it (or, with ``wait``, queues behind
    it); in a distributed run every rank stops alike, with no rank left in a collective.
    """
    rank, world = get_dist_info()
    with ExitStack() as stack:
        error = None
        if rank == 0:
            try:
                stack.enter_context(exclusive_lock(
                    path, wait, waiting=lambda msg: print_log(msg, logger='current')))
            except FileLockedError as err:
                error = str(err)
        if world > 1:  # NOTE: every rank is here, before any cell: the collective is safe
            box = [error]
            broadcast_object_list(box)
            error = box[0]
        if error:
            raise FileLockedError(error)
        yield


class RobustnessResults(ResultsStore):
    """The JSON results file: identity, cells and timings; atomic writes; resume checks."""

    def __init__(self, path: str, identity: Dict) -> None:
        super().__init__(path, {'format': RESULTS_FORMAT, **identity}, entries_key='cells',
                         identity_keys=('format', ) + IDENTITY_KEYS,
                         fix='delete the file to start fresh, or pass --results with another '
                         'path')
        self.data.setdefault('timing', {})

    def done(self, corruption: str, severity: int) -> bool:
        return super().done(corruption, str(severity))

    def record(self, corruption: str, severity: int, metrics: Dict, timing: Dict) -> None:
        self.data['timing'].setdefault(corruption, {})[str(severity)] = timing
        super().record(corruption, str(severity), value=metrics)


def _numeric(metrics: Dict) -> Dict[str, float]:
    out = {}
    for key, value in metrics.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue  # NOTE: e.g. mmdet's per-class tables; P/mPC/rPC need scalars
    return out


def _loading_share(runner, iterations: int) -> Dict[str, float]:
    """Seconds the test loop waited for data vs. its total, from mmengine's IterTimerHook."""
    hub = runner.message_hub
    try:
        waits = hub.get_scalar('test/data_time').data[0][-iterations:]
        totals = hub.get_scalar('test/time').data[0][-iterations:]
    except KeyError:
        return {}
    return {'data_wait_s': round(float(waits.sum()), 3), 'iter_s': round(float(totals.sum()), 3)}


def evaluate_robustness(runner, cfg: Config, protocol: Protocol, results_path: str, seed: int = 0,
                        bgr_compat: bool = False, corrupted_root: Optional[str] = None,
                        checkpoint: str = '', save_predictions: Optional[str] = None,
                        progress: bool = True, partial_load: bool = False,
                        coco_backend: Optional[str] = None) -> Dict:
    """Evaluate the clean set and every cell of ``protocol``; returns the results dict.

    ``runner`` has its model built and its checkpoint loaded already (once for all cells);
    ``partial_load`` (the checkpoint did not fit the model exactly) is recorded in the results.
    COCO metrics are evaluated by ``coco_backend`` (default: the metric's own ``backend``, else
    :data:`DEFAULT_ROBUSTNESS_BACKEND`); the library and its version are recorded per cell.
    """
    from mmengine.runner import TestLoop
    from tqdm import tqdm

    if corrupted_root is None:
        for dataset in leaf_datasets(cfg.test_dataloader['dataset']):
            find_loading_step(list(dataset['pipeline']))
    # NOTE: an unknown or missing backend stops here, before any inference
    cell_evaluator, backends = select_coco_backend(copy.deepcopy(cfg.test_evaluator),
                                                   coco_backend, DEFAULT_ROBUSTNESS_BACKEND)
    cell_evaluator, _ = use_fast_iou(cell_evaluator)  # NOTE: mmseg's numbers, cheaper per image
    rank, _ = get_dist_info()
    identity = {
        'protocol': protocol.name,
        'cells_planned': {c: list(s) for c, s in protocol.severities.items()},
        'seed': seed, 'bgr_compat': bgr_compat,
        'source': 'stored' if corrupted_root else 'on-the-fly',
        'corrupted_root': corrupted_root,
        'config': cfg.filename, 'config_sha256': config_sha256(cfg),
        'checkpoint': checkpoint,
        'checkpoint_sha256': file_sha256(checkpoint) if checkpoint else None,
        'scope': cfg.get('default_scope'), 'mmrobust': __version__,
    }
    if partial_load:
        identity['partial_load'] = 'the checkpoint did not match the model; see the log'
    results = RobustnessResults(results_path, identity)
    if backends:  # the latest run's; each cell records its own in its timing
        results.data['coco_backend'] = ', '.join(backends)
    todo = [(CLEAN, 0)] + protocol.cells()
    todo = [(c, s) for c, s in todo if not results.done(c, s)]
    barrier()

    bar = tqdm(total=len(todo), unit='cell', disable=not progress or rank != 0,
               desc=f'{protocol.name}', dynamic_ncols=True)
    for corruption, severity in todo:
        bar.set_postfix_str(f'{corruption} {severity}' if severity else corruption)
        loader = cell_dataloader(cfg, None if corruption == CLEAN else corruption, severity,
                                 seed, bgr_compat, corrupted_root)
        evaluator = copy.deepcopy(cell_evaluator)  # NOTE: a fresh metric for every cell
        if save_predictions:
            evaluator = list(evaluator) if isinstance(evaluator, (list, tuple)) else [evaluator]
            evaluator.append(dict(type='DumpResults', out_file_path=osp.join(
                save_predictions, f'{corruption}_{severity}.pkl')))
        start = time.perf_counter()
        loop = TestLoop(runner, loader, evaluator)
        metrics = loop.run()
        timing = {'wall_s': round(time.perf_counter() - start, 3),
                  **_loading_share(runner, len(loop.dataloader))}
        if backends:
            timing['metric_backend'] = ', '.join(backends)
        if rank == 0:
            results.record(corruption, severity, _numeric(metrics), timing)
        bar.update(1)
    bar.close()
    barrier()
    if rank == 0 and not todo:
        results.save()
    return results.data
