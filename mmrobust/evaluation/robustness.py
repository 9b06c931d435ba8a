"""Corruption-robustness evaluation of any mmdet / mmseg config: every cell, one model, resumable.

``evaluate_robustness`` evaluates the clean test set and each (corruption, severity) cell of a
protocol with a runner whose model and checkpoint are loaded once, from one dataloader whose
dataset is built once (:mod:`.cell_kinds.one_pass`; a dataloader per cell where one cannot serve
them all).
A cell's images are corrupted on the fly (in the dataloader workers, right after the
image-loading step) or read from a corrupted copy written by ``tools/make_corrupted.py``. Each
cell's metric runs in a worker process beside the next cells' inference (:mod:`.metric_queue`).
Attack cells (:mod:`.attacks`) and real-world shift cells (another set through the same
pipeline and metric, :mod:`~mmrobust.datasets.shift_sets`) follow, each with its own
dataloader; neither is in mPC / rPC. What differs by kind of cell (planning, identity, checks,
dataloader, model context, evaluator config, image roots) is the kind's
(:mod:`.cell_kinds`): the run loops over the kinds. After every cell the results file
(:mod:`.results`) is rewritten atomically; a rerun with the same identity skips finished cells
and computes the metrics of saved predictions.
"""
import dataclasses
import hashlib
import itertools
import json
import os
import os.path as osp
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from mmengine.config import Config
from mmengine.dist import barrier, get_dist_info
from mmengine.logging import print_log

from ..corruptions import Protocol
from ..utils.errors import MMRobustError, UsageError
from ..utils.processes import children_die_with_parent
from ..utils.progress import Progress
from .cell_evaluators import CellEvaluators
from .cell_kinds import CELL_KINDS, Cell, CellKind, CellRun, RunSpec, kind_of
from .cell_kinds.builtin import BUILTIN_KINDS
from .evaluator_cfg import side_file_metrics, without_backend, without_unread_gt_masks
from .loop import DEFAULT_POST_PROCESS_QUEUE, DEFAULT_PREFETCH
from .metric_queue import MetricQueue, RankedQueue
from .metric_worker import worker_imports
from .per_image import StatsTarget, has_stats, stats_path
from .rank0 import RANK0_POLL_S, Plan, broadcast_plan, plan_on_rank0
from .results import (
    CUSTOM_IMPORTS_KEY,
    ResultsLayout,
    RobustnessResults,
    custom_import_names,
    evaluation_sha256,
    planned_cells,
    run_identity,
)
from .shards import parse_shard, shard_cells

#: Cells whose metrics may be in flight beside the next cell's inference (``--metric-queue``).
DEFAULT_METRIC_QUEUE = 2



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


# the options RobustnessOptions.validated() reads: a change to one is checked again
_VALIDATED = ('metric_queue', 'post_process_queue', 'prefetch', 'shard', 'seed', 'bgr_compat',
              'corrupted_root', 'attacks', 'shifts', 'shift_roots', 'kind_options')


@dataclass
class RobustnessOptions:
    """How :func:`evaluate_robustness` runs.

    ``tools/test_robustness.py`` builds it from its arguments.

    Attributes:
        seed, bgr_compat: of the on-the-fly corruptions (None: not given; 0 and RGB). A stored
            set (``corrupted_root``, checked by
            :func:`~mmrobust.corruptions.stored.read_stored_set`) has its own, from its
            manifest, which the given ones must agree with.
        corrupted_root: read the cells from this stored set instead of corrupting on the fly.
        checkpoint: the checkpoint's path (recorded with its SHA-256).
        save_predictions: also dump each cell's predictions into this folder.
        progress: a progress bar on rank 0.
        checkpoint_load: what the strict load found (``StrictLoadHook.last_load``), recorded,
            and ``partial_load`` with the lists when the checkpoint did not fit exactly.
        coco_backend: of COCO metrics (default: the metric's own, else
            :data:`DEFAULT_ROBUSTNESS_BACKEND`); recorded per cell.
        metric_queue: K cells' metrics in flight in a worker process beside the next cells'
            inference (:class:`~.metric_queue.MetricQueue`); 0: serial.
        one_pass: every cell from one dataloader (:mod:`.cell_kinds.one_pass`), else one per cell.
        post_process_queue: batches whose post-processing (``evaluator.process``: outputs to
            the host, mask encoding) waits in a thread beside the next batches' forward
            (:mod:`.loop`); 0: in the loop.
        prefetch: batches received and preprocessed ahead of the model, on a thread
            (:mod:`.loop`); 0: in the loop.
        shard: ``(i, n)``, the i-th of n disjoint shards of the cells
            (:func:`~.shards.shard_cells`; joined by :func:`~.shards.merge_results`).
        attacks: adversarial cells ``(attack, k)`` (:func:`~.attacks.attack_plan`).
        per_image: keep each cell's per-image statistics (:mod:`.per_image`) for the
            report's intervals.
        refresh_per_image: infer again the recorded cells whose per-image statistics are
            missing or another evaluation's (their numbers recorded anew: the same).
        shifts: real-world shift cells ``(set, level)``
            (:func:`~mmrobust.datasets.shift_sets.parse_shifts`), beside the corruption cells
            and not in mPC / rPC.
        shift_roots: ``{family: root}`` of the shift sets (default: ``data/<family>``).
        kind_options: ``{kind: options}`` of cell kinds registered besides the built-in ones
            (:attr:`~.cell_kinds.RunSpec.kind_options`).
    """
    seed: Optional[int] = None
    bgr_compat: Optional[bool] = None
    corrupted_root: Optional[str] = None
    checkpoint: str = ''
    save_predictions: Optional[str] = None
    progress: bool = True
    checkpoint_load: Optional[Dict] = None
    coco_backend: Optional[str] = None
    metric_queue: int = DEFAULT_METRIC_QUEUE
    one_pass: bool = True
    post_process_queue: int = DEFAULT_POST_PROCESS_QUEUE
    prefetch: int = DEFAULT_PREFETCH
    shard: Optional[Tuple[int, int]] = None
    attacks: Optional[Dict[str, Dict]] = None
    per_image: bool = True
    refresh_per_image: bool = False
    shifts: Optional[List[Cell]] = None
    shift_roots: Optional[Dict[str, str]] = None
    kind_options: Optional[Dict[str, Any]] = None
    _validated: Optional[Tuple[Any, RunSpec]] = field(default=None, init=False, repr=False,
                                                      compare=False)

    def validated(self, protocol: Protocol) -> RunSpec:
        """The run's :class:`~.cell_kinds.RunSpec`, checked once before any model is built.

        The options' own ranges, the shard, then each kind's :meth:`~.cell_kinds.CellKind.check`
        (a stored set's manifest, the shift sets' layouts). ``tools/test_robustness.py`` calls
        it before building the runner; :func:`evaluate_robustness` gets the same spec back
        unless an option changed since.

        Raises:
            UsageError: a queue depth below 0. ``ShardError``, ``StoredSetError``,
                ``ShiftDatasetError``: from the checks.
        """
        # NOTE: the kinds too: one registered since (a config's custom_imports) checks its own
        key = (protocol, repr([getattr(self, k) for k in _VALIDATED]), tuple(CELL_KINDS))
        if self._validated is not None and self._validated[0] == key:
            return self._validated[1]
        if self.metric_queue < 0:
            raise UsageError('--metric-queue (metric_queue) must be 0 (serial) or more, got '
                             f'{self.metric_queue}')
        for name in ('post_process_queue', 'prefetch'):
            if getattr(self, name) < 0:
                raise UsageError(f'--{name.replace("_", "-")} ({name}) must be 0 (in the loop) '
                                 f'or more, got {getattr(self, name)}')
        if self.shard is not None:
            parse_shard(f'{self.shard[0]}/{self.shard[1]}')  # NOTE: raises ShardError
        unknown = sorted(set(self.kind_options or {}) - set(CELL_KINDS))
        if unknown:
            raise UsageError(f'kind_options name {", ".join(unknown)}, which no registered '
                             f'cell kind is ({", ".join(CELL_KINDS)}): register the kind first')
        spec = RunSpec(protocol, 0 if self.seed is None else self.seed, bool(self.bgr_compat),
                       self.corrupted_root, None, self.attacks or None,
                       tuple(self.shifts) if self.shifts else None, self.shift_roots,
                       dict(self.kind_options or {}))
        if self.corrupted_root is not None:  # NOTE: None: the stored set's own, if recorded
            spec = dataclasses.replace(spec, seed=self.seed, bgr_compat=self.bgr_compat)
        for kind in CELL_KINDS.values():
            spec = kind.check(spec)
        self._validated = (key, spec)
        return spec


def _check_run(runner, cfg: Config, spec: RunSpec) -> None:
    """Every kind's pre-flight with the config and the model, before any inference."""
    for kind in CELL_KINDS.values():
        kind.check_run(runner, cfg, spec)


def _open_results(cfg: Config, layout: ResultsLayout, opts: RobustnessOptions, spec: RunSpec,
                  backends: List[str], use_saved: bool = True
                  ) -> Tuple[Optional[RobustnessResults], Plan]:
    """Rank 0 opens (or resumes) the results file and plans the cells.

    Every rank gets the plan (or rank 0's error). ``use_saved``: a killed run's saved predictions
    may be used (not when a metric's files belong to the process that wrote them).
    """
    results: Optional[RobustnessResults] = None
    plan: Optional[Plan] = None
    if get_dist_info()[0] == 0:  # NOTE: only rank 0 reads the results file (it may be local)
        try:
            identity = _identity(cfg, opts, spec)
            _say_idle_kinds(identity)
            results = RobustnessResults(layout.results_path, identity)
            if backends:  # the latest run's; each cell records its own in its timing
                results.data['coco_backend'] = ', '.join(backends)
            imports = custom_import_names(cfg)
            if imports:  # NOTE: what registered the cells (a user's family or kind), for readers
                results.data[CUSTOM_IMPORTS_KEY] = imports
            fingerprint = evaluation_sha256(results.identity)
            plan = plan_on_rank0(results, layout.predictions, opts.shard, use_saved, refresh=(
                (lambda cell: not has_stats(stats_path(layout.per_image, *cell), fingerprint))
                if opts.per_image and opts.refresh_per_image else None))
        except Exception as err:
            plan = Plan(infer=[], error=err)
    return results, broadcast_plan(plan)


def _identity(cfg: Config, opts: RobustnessOptions, spec: RunSpec) -> Dict[str, Any]:
    """What the results of this run record of its evaluation (:func:`~.results.run_identity`)."""
    return run_identity(spec, config=cfg.filename, config_sha256=config_sha256(cfg),
                        checkpoint=opts.checkpoint, scope=cfg.get('default_scope'),
                        shard=opts.shard, checkpoint_load=opts.checkpoint_load)


def recorded_results(cfg: Config, protocol: Protocol, results_path: str,
                     options: RobustnessOptions) -> Optional[Dict]:
    """The results at ``results_path`` if a run of ``options`` has nothing left to do there.

    Every planned cell (of its shard) recorded by the same evaluation: read only, before a model
    is built or the lock taken, so that a finished run's table prints from a read-only or full
    disk. None otherwise, the file mismatching included (the run itself says what is wrong).
    """
    if not osp.isfile(results_path) or options.refresh_per_image:
        return None
    spec = options.validated(protocol)
    try:
        results = RobustnessResults(results_path, _identity(cfg, options, spec))
    except MMRobustError:  # NOTE: another evaluation's file: the run refuses it, saying why
        return None
    cells = planned_cells(results.identity)
    if options.shard is not None:
        cells = shard_cells(cells, *options.shard)
    return results.data if all(results.done(c, s) for c, s in cells) else None


def _say_idle_kinds(identity: Dict) -> None:
    """Log a kind registered besides the built-in ones that plans no cell (its options unset)."""
    for kind in CELL_KINDS.values():
        if kind not in BUILTIN_KINDS and not kind.planned(identity):
            print_log(f'cell kind {kind.name!r} is registered but plans no cell: give it its '
                      f'options (its command-line options, or the config\'s '
                      f'robustness_kind_options.{kind.name}; RobustnessOptions.kind_options)',
                      logger='current', level=30)


def _stats_targets(cfg: Config, results: Optional[RobustnessResults], layout: ResultsLayout,
                   spec: RunSpec, per_image: bool):
    """Where each cell's per-image statistics go (rank 0; None: not kept)."""
    def target(cell: Cell) -> Optional[StatsTarget]:
        if not per_image or results is None:
            return None
        return StatsTarget(stats_path(layout.per_image, *cell), cell,
                           evaluation_sha256(results.identity),
                           kind_of(cell[0]).image_roots(cfg, cell, spec))
    return target


def evaluate_robustness(runner, cfg: Config, protocol: Protocol, results_path: str,
                        options: Optional[RobustnessOptions] = None) -> Dict:
    """Evaluate the clean set, every cell of ``protocol`` and the attack cells.

    Returns the results dict (rank 0; an empty dict on the other ranks).

    ``runner`` has its model built and its checkpoint loaded already (once for all cells). The
    results identity (:func:`~.results.run_identity`) records what is evaluated; a rerun with
    the same identity skips the recorded cells and computes the metrics of saved predictions.
    Each cell's timing records ``inference_s``, ``metric_s`` and ``wait_s``; the run's
    ``time`` where this run's time went. ``options``: :class:`RobustnessOptions`.

    Raises:
        MetricWorkerError: the metric worker died or its metric failed; the cell's predictions
            are kept and a rerun resumes from them.
    """
    opts = options or RobustnessOptions()
    children_die_with_parent()  # NOTE: a killed run's dataloader workers must not outlive it
    spec = opts.validated(protocol)  # NOTE: the tool's, when it checked them already
    _check_run(runner, cfg, spec)  # NOTE: stops before any inference
    evaluators = CellEvaluators.build(cfg, opts, spec)
    writes_files = side_file_metrics(evaluators.evaluator)  # NOTE: format_only stops here
    if writes_files and opts.one_pass:
        print_log(f'one dataloader for every cell is not used: {writes_files}', logger='current')
    depth = opts.metric_queue
    if writes_files and depth:
        # NOTE: their files belong to the objects that wrote them (mmseg's CityscapesMetric
        # removes its folder when dropped, mmdet's CityScapesMetric empties it when built), so
        # no other process can compute from them
        depth = 0
        print_log(f'each cell\'s metric is computed in this process right after its inference, '
                  f'not beside the next cell ({writes_files})', logger='current', level=30)
    # NOTE: every rank, before any inference: a metric the worker could not build stops here
    imports = worker_imports(evaluators.evaluator, cfg.get('custom_imports'),
                             cfg.get('default_scope')) if depth else []
    layout = ResultsLayout(results_path)
    rank, _ = get_dist_info()
    results, plan = _open_results(cfg, layout, opts, spec, evaluators.backends,
                                  use_saved=not writes_files)
    queue = RankedQueue(MetricQueue(
        runner, results, depth, layout.predictions, evaluators,
        _stats_targets(cfg, results, layout, spec, opts.per_image), evaluators.backends,
        cfg.get('default_scope'), imports, RANK0_POLL_S) if results is not None else None)
    progress_bar = Progress(0, 'image', protocol.name, enabled=opts.progress and rank == 0)
    run_start = time.perf_counter()
    try:
        for cell, path in plan.saved.items():  # NOTE: rank 0's plan, broadcast to every rank
            queue.resume_saved(cell, path)
        loading = _infer_cells(CellRun(runner, cfg, cfg, spec, evaluators, progress_bar,
                                       opts.post_process_queue, opts.prefetch, opts.one_pass,
                                       writes_files), plan, queue)
        if depth != opts.metric_queue and plan.infer:
            loading['metric_queue'] = f'0, not {opts.metric_queue} ({writes_files})'
        queue.drain()
    except BaseException:
        queue.close(cancel=True)
        raise
    finally:
        progress_bar.close()
    queue.close()
    if rank == 0 and osp.isdir(layout.predictions) and not os.listdir(layout.predictions):
        os.rmdir(layout.predictions)
    barrier()
    if results is not None:
        _finish_results(results, plan, loading, time.perf_counter() - run_start)
    return results.data if results is not None else {}


def _by_kind(cells: List[Cell]) -> Dict[str, Tuple[CellKind, List[Cell]]]:
    """``cells`` grouped by the kind that infers them, in run order."""
    groups: Dict[str, Tuple[CellKind, List[Cell]]] = {}
    for cell in cells:
        kind = kind_of(cell[0])
        kind = CELL_KINDS[kind.inferred_by] if kind.inferred_by else kind
        groups.setdefault(kind.name, (kind, []))[1].append(cell)
    return groups


def _infer_cells(run: CellRun, plan: Plan, queue: RankedQueue) -> Dict[str, str]:
    """Every planned cell's inference, kind by kind, each cell handed to rank 0's metric queue.

    Returns how the cells were loaded (a kind's ``loader``; ``gt_masks``: whether the
    ground-truth masks were decoded, :func:`~.cell_evaluators.without_unread_gt_masks`): what
    this run did only, so a rerun that inferred no corruption cell keeps the loader the
    inferring run recorded.
    """
    groups = _by_kind(plan.infer)
    # NOTE: cells read what their metrics read, except a kind that reads the config's own
    # ground truth (an attack's loss)
    scored = [c for kind, cells in groups.values() if not kind.config_ground_truth
              for c in cells]
    if scored:
        run.light, gt_masks = without_unread_gt_masks(run.cfg, run.evaluators(scored[0])[0])
        if gt_masks:
            run.loading['gt_masks'] = gt_masks
            # NOTE: the built-in kinds that read what their metrics read
            print_log(f'ground-truth masks of the corruption and shift cells: {gt_masks}',
                      logger='current')
    inference = itertools.chain.from_iterable(
        kind.infer(run, cells) for kind, cells in groups.values())
    for cell, parts, loop_metrics, dataset_meta, timing in inference:
        queue.finish(cell, parts, loop_metrics, dataset_meta, timing)
    return run.loading


def _finish_results(results: RobustnessResults, plan: Plan, loading: Dict[str, str],
                    wall: float) -> None:
    """Rank 0, every cell recorded.

    What each kind computes from the recorded cells (the worst case over attacks), how the cells
    were loaded, where the time went; the file saved.
    """
    for kind in CELL_KINDS.values():
        for what, why in kind.finish(results.path, results.data).items():
            print_log(f'no {what}: {why}', logger='current', level=30)
    results.data.update(loading)
    completed = False
    if all(results.done(c, s) for c, s in planned_cells(results.identity)):
        # NOTE: a partial merge, completed by this run
        completed = results.data.pop('partial', None) is not None
    if not plan.infer and not plan.saved:  # NOTE: nothing left to do: the file stays as the
        if completed:  # run that did the work left it (a full or read-only disk too)
            results.save()
        print_log('every planned cell was recorded already: nothing inferred or computed',
                  logger='current')
        return
    summary = _time_summary(results, plan, wall)
    results.data['time'] = summary
    results.save()
    print_log('where the time went: ' + ', '.join(
        f'{k[:-2]} {v} s ({summary["shares"][k]:.0%})' for k, v in summary.items()
        if k in summary['shares']) + f'; wall {summary["wall_s"]} s', logger='current')


def _time_summary(results: RobustnessResults, plan: Plan, wall: float) -> Dict[str, Any]:
    """This run's seconds, by what they were spent on.

    This run's seconds: inference (of which waiting for data), waiting for metrics, saving
    predictions and the rest (set-up: the dataset, workers, model), with their shares.
    """
    cells = [results.data['timing'][c][str(s)] for c, s in list(plan.saved) + plan.infer
             if str(s) in results.data['timing'].get(c, {})]
    fresh = [t for t in cells if not t.get('resumed_from_predictions')]
    inference = sum(t.get('inference_s', 0.0) for t in fresh)
    data_wait = sum(t.get('data_wait_s', 0.0) for t in fresh)
    metric_wait = sum(t.get('wait_s', 0.0) for t in cells)
    saving = sum(t.get('save_s', 0.0) for t in fresh)
    parts = {'inference_s': inference - data_wait, 'data_wait_s': data_wait,
             'metric_wait_s': metric_wait, 'save_s': saving,
             'setup_other_s': max(0.0, wall - inference - metric_wait - saving)}
    return {'wall_s': round(wall, 3), **{k: round(v, 3) for k, v in parts.items()},
            'shares': {k: (v / wall if wall > 0 else 0.0) for k, v in parts.items()}}
