"""Corruption-robustness evaluation of any mmdet / mmseg config: every cell, one model, resumable.

``evaluate_robustness`` evaluates the clean test set and each (corruption, severity) cell of a
protocol with a runner whose model and checkpoint are loaded once, from one dataloader whose
dataset is built once (:mod:`.one_pass`; a dataloader per cell where one cannot serve them all).
A cell's images are corrupted on the fly (in the dataloader workers, right after the
image-loading step) or read from a corrupted copy written by ``tools/make_corrupted.py``. Each
cell's metric runs in a worker process beside the next cells' inference (:mod:`.metric_queue`).
Attack cells (:mod:`.attacks`) and real-world shift cells (another set through the same
pipeline and metric, :mod:`~mmrobust.datasets.shift_sets`) follow, each with its own
dataloader; neither is in mPC / rPC. After every cell the results file (:mod:`.results`) is
rewritten atomically; a rerun with the same identity skips finished cells and computes the
metrics of saved predictions.
"""
import hashlib
import itertools
import json
import os
import os.path as osp
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from mmengine.config import Config
from mmengine.dist import barrier, get_dist_info
from mmengine.logging import print_log

from ..corruptions import Protocol
from ..corruptions.stored import (
    MANIFEST,
    cell_folder,
    read_stored_set,
    stored_content_identity,
    stored_set_identity,
    stored_settings,
)
from ..datasets.shift_sets import check_shift_root, shift_identity
from ..models.utils import unwrap_model
from ..utils.config_checks import leaf_datasets
from ..utils.processes import children_die_with_parent
from ..utils.progress import Progress
from .attacks import attack_of_cell, check_attack_pipeline
from .background import (
    worker_imports,
)
from .cell_evaluators import CellEvaluators, side_file_metrics, without_unread_gt_masks
from .cell_inference import one_pass_cells, per_cell_cells
from .cells import (
    CLEAN,
    WORST,
    Cell,
    CellSource,
    find_loading_step,
    is_attack_cell,
    is_corruption_cell,
    is_shift_cell,
    shift_dataloader,
)
from .coco_metric import (
    without_backend,
)
from .metric_queue import MetricQueue
from .one_pass import OnePassUnsupported
from .overlapped_loop import DEFAULT_POST_PROCESS_QUEUE, DEFAULT_PREFETCH
from .per_image import StatsTarget, stats_path
from .rank0 import (
    RANK0_POLL_S,
    Plan,
    broadcast_plan,
    plan_on_rank0,
    rank0_until_done,
)
from .results import (
    ResultsLayout,
    RobustnessResults,
    evaluation_sha256,
    make_identity,
    parse_shard,
    planned_cells,
)
from .worst_case import add_worst_case

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


# -- the results file ------------------------------------------------------------------------------

# -- the loop --------------------------------------------------------------------------------------

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
        one_pass: every cell from one dataloader (:mod:`.one_pass`), else one per cell.
        post_process_queue: batches whose post-processing (``evaluator.process``: outputs to
            the host, mask encoding) waits in a thread beside the next batches' forward
            (:mod:`.overlapped_loop`); 0: in the loop.
        prefetch: batches received and preprocessed ahead of the model, on a thread
            (:mod:`.overlapped_loop`); 0: in the loop.
        shard: ``(i, n)``, the i-th of n disjoint shards of the cells
            (:func:`~.results.shard_cells`; joined by :func:`~.results.merge_results`).
        attacks: adversarial cells ``(attack, k)`` (:func:`~.attacks.attack_plan`).
        per_image: keep each cell's per-image statistics (:mod:`.per_image`) for the
            report's intervals.
        shifts: real-world shift cells ``(set, level)``
            (:func:`~mmrobust.datasets.shift_sets.parse_shifts`), beside the corruption cells
            and not in mPC / rPC.
        shift_roots: ``{family: root}`` of the shift sets (default: ``data/<family>``).
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
    shifts: Optional[List[Cell]] = None
    shift_roots: Optional[Dict[str, str]] = None


def _resolve_source(runner, cfg: Config, protocol: Protocol, opts: RobustnessOptions
                    ) -> Tuple[CellSource, Optional[Dict]]:
    """Where the cells' images come from, and the stored set's provenance.

    Stops before any inference on a pipeline that cannot be corrupted or attacked, or a bad shard.
    """
    if opts.metric_queue < 0:
        raise ValueError(f'metric_queue must be 0 (serial) or more, got {opts.metric_queue}')
    if opts.post_process_queue < 0 or opts.prefetch < 0:
        raise ValueError('post_process_queue and prefetch must be 0 (in the loop) or more, '
                         f'got {opts.post_process_queue} and {opts.prefetch}')
    if opts.shard is not None:
        parse_shard(f'{opts.shard[0]}/{opts.shard[1]}')  # NOTE: raises ShardError
    for dataset in leaf_datasets(cfg.test_dataloader['dataset']):
        find_loading_step(list(dataset['pipeline']))
    if opts.attacks:  # NOTE: stop before any inference when the attacks cannot run
        check_attack_pipeline(cfg)
        model = unwrap_model(runner.model)
        for name in opts.attacks:
            attack_of_cell(opts.attacks, name, 1).check_model(model)
    for name, level in opts.shifts or ():  # NOTE: a missing or mis-laid set stops here
        check_shift_root(name, level, opts.shift_roots,
                         task='segmentation' if cfg.get('default_scope') == 'mmseg'
                         else 'detection')
    root = opts.corrupted_root
    if root is None:
        return CellSource(0 if opts.seed is None else opts.seed, bool(opts.bgr_compat)), None
    manifest = read_stored_set(root)  # NOTE: the set's own seed and colour order are recorded
    seed, bgr_compat = stored_settings(root, manifest, opts.seed, opts.bgr_compat)
    if manifest is None:
        print_log(f'{root} has no {MANIFEST} (not written by make_corrupted.py): how its cells '
                  'were made is unknown; the results record that (stored_set) and the seed / '
                  f'colour mode given ({seed}, bgr_compat={bgr_compat})', logger='current',
                  level=30)
        # NOTE: its identity is its content (paths and sizes of the cells read), so that a
        # rerun on another set is evaluated, not relabelled
        # (rank 0 alone compares it: a stat per file, once)
        return CellSource(seed, bgr_compat, root), stored_content_identity(
            root, [(c, s) for c, sevs in protocol.severities.items() for s in sevs]
        ) if get_dist_info()[0] == 0 else stored_set_identity(None)
    return CellSource(seed, bgr_compat, root), stored_set_identity(manifest)


def _open_results(cfg: Config, protocol: Protocol, layout: ResultsLayout, opts: RobustnessOptions,
                  source: CellSource, stored_set: Optional[Dict], backends: List[str],
                  use_saved: bool = True) -> Tuple[Optional[RobustnessResults], Plan]:
    """Rank 0 opens (or resumes) the results file and plans the cells.

    Every rank gets the plan (or rank 0's error). ``use_saved``: a killed run's saved predictions
    may be used (not when a metric's files belong to the process that wrote them).
    """
    results: Optional[RobustnessResults] = None
    plan: Optional[Plan] = None
    if get_dist_info()[0] == 0:  # NOTE: only rank 0 reads the results file (it may be local)
        try:
            identity = make_identity(
                protocol, source.seed, source.bgr_compat, stored_set=stored_set,
                corrupted_root=source.corrupted_root, attacks=opts.attacks,
                config=cfg.filename, config_sha256=config_sha256(cfg),
                checkpoint=opts.checkpoint, scope=cfg.get('default_scope'), shard=opts.shard,
                checkpoint_load=opts.checkpoint_load,
                shifts=shift_identity(opts.shifts) if opts.shifts else None)
            results = RobustnessResults(layout.results_path, identity)
            if backends:  # the latest run's; each cell records its own in its timing
                results.data['coco_backend'] = ', '.join(backends)
            plan = plan_on_rank0(results, layout.predictions, opts.shard, use_saved)
        except Exception as err:
            plan = Plan(infer=[], error=err)
    return results, broadcast_plan(plan)


def _stats_targets(cfg: Config, results: Optional[RobustnessResults], layout: ResultsLayout,
                   source: CellSource, per_image: bool,
                   shift_roots: Optional[Dict[str, str]] = None):
    """Where each cell's per-image statistics go (rank 0; None: not kept)."""
    def target(cell: Cell) -> Optional[StatsTarget]:
        if not per_image or results is None:
            return None
        return StatsTarget(stats_path(layout.per_image, *cell), cell,
                           evaluation_sha256(results.identity),
                           _image_roots(cfg, source.corrupted_root, cell, shift_roots))
    return target


def evaluate_robustness(runner, cfg: Config, protocol: Protocol, results_path: str,
                        options: Optional[RobustnessOptions] = None) -> Dict:
    """Evaluate the clean set, every cell of ``protocol`` and the attack cells.

    Returns the results dict (rank 0; an empty dict on the other ranks).

    ``runner`` has its model built and its checkpoint loaded already (once for all cells). The
    results identity (:func:`~.results.make_identity`) records what is evaluated; a rerun with
    the same identity skips the recorded cells and computes the metrics of saved predictions.
    Each cell's timing records ``inference_s``, ``metric_s`` and ``wait_s``; the run's
    ``time`` where this run's time went. ``options``: :class:`RobustnessOptions`.

    Raises:
        MetricWorkerError: the metric worker died or its metric failed; the cell's predictions
            are kept and a rerun resumes from them.
    """
    opts = options or RobustnessOptions()
    children_die_with_parent()  # NOTE: a killed run's dataloader workers must not outlive it
    source, stored_set = _resolve_source(runner, cfg, protocol, opts)
    evaluators = CellEvaluators.build(cfg, opts)
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
    results, plan = _open_results(cfg, protocol, layout, opts, source, stored_set,
                                  evaluators.backends, use_saved=not writes_files)
    queue = MetricQueue(runner, results, depth, layout.predictions, evaluators,
                        _stats_targets(cfg, results, layout, source, opts.per_image,
                                       opts.shift_roots),
                        evaluators.backends, cfg.get('default_scope'), imports, RANK0_POLL_S
                        ) if results is not None else None
    progress_bar = Progress(0, 'image', protocol.name, enabled=opts.progress and rank == 0)
    run_start = time.perf_counter()
    try:
        for cell, path in plan.saved.items():  # NOTE: rank 0's plan, broadcast to every rank
            rank0_until_done(queue.resume_saved(cell, path) if queue else None)
        loading = _infer_cells(runner, cfg, plan, opts, source, evaluators, writes_files,
                               queue, progress_bar)
        if depth != opts.metric_queue and plan.infer:
            loading['metric_queue'] = f'0, not {opts.metric_queue} ({writes_files})'
        rank0_until_done(queue.drain() if queue else None)
    except BaseException:
        if queue is not None:
            queue.close(cancel=True)
        raise
    finally:
        progress_bar.close()
    if queue is not None:
        queue.close()
    if rank == 0 and osp.isdir(layout.predictions) and not os.listdir(layout.predictions):
        os.rmdir(layout.predictions)
    barrier()
    if results is not None:
        _finish_results(results, plan, loading, time.perf_counter() - run_start)
    return results.data if results is not None else {}


def _infer_cells(runner, cfg: Config, plan: Plan, opts: RobustnessOptions, source: CellSource,
                 evaluators: CellEvaluators, writes_files: Optional[str],
                 queue: Optional[MetricQueue], progress_bar: Progress) -> Dict[str, str]:
    """Every planned cell's inference, each handed to rank 0's metric queue.

    The corruption cells from one dataloader where it can serve them all, the attack cells from
    their own. Returns how the corruption cells were loaded (``loader``, ``gt_masks``: whether their
    ground-truth masks were decoded, :func:`~.cell_evaluators.without_unread_gt_masks`).
    """
    attacked = [c for c in plan.infer if is_attack_cell(c[0])]
    shifted = [c for c in plan.infer if is_shift_cell(c[0])]
    corrupted = [c for c in plan.infer if c[0] == CLEAN or is_corruption_cell(c[0])]
    loader_kind = 'one-pass'
    loading: Dict[str, str] = {}
    inference = None
    # NOTE: corruption and shift cells read what their metrics read; an attack's loss needs
    # the ground truth the config's own pipeline loads
    scored = corrupted + shifted
    light = cfg
    if scored:
        light, gt_masks = without_unread_gt_masks(cfg, evaluators(scored[0])[0])
        if gt_masks:
            loading['gt_masks'] = gt_masks
            print_log(f'ground-truth masks of the corruption and shift cells: {gt_masks}',
                      logger='current')
    if corrupted:
        if writes_files:
            loader_kind = f'per-cell ({writes_files})'
        elif opts.one_pass:
            try:
                inference = one_pass_cells(runner, light, corrupted,
                                            evaluators(corrupted[0])[0],
                                            source.seed, source.bgr_compat,
                                            source.corrupted_root, progress_bar,
                                            opts.post_process_queue, opts.prefetch)
            except OnePassUnsupported as err:
                loader_kind = f'per-cell ({err})'
                print_log(f'one dataloader cannot serve every cell ({err}): each cell builds '
                          'its own', logger='current', level=30)
        else:
            loader_kind = 'per-cell (asked for)'
        if inference is None:
            inference = per_cell_cells(runner, light, corrupted, evaluators, source.seed,
                                        source.bgr_compat, source.corrupted_root, progress_bar,
                                        post_process_queue=opts.post_process_queue,
                                        prefetch=opts.prefetch)
    if attacked:
        assert opts.attacks
        attacks = per_cell_cells(runner, cfg, attacked, evaluators, source.seed,
                                  source.bgr_compat, None, progress_bar, opts.attacks,
                                  opts.post_process_queue)
        inference = attacks if inference is None else itertools.chain(inference, attacks)
    if shifted:  # NOTE: each reads its own set: a dataloader each, the config's pipeline
        shifts = per_cell_cells(runner, light, shifted, evaluators, source.seed,
                                source.bgr_compat, None, progress_bar,
                                post_process_queue=opts.post_process_queue,
                                prefetch=opts.prefetch, shift_roots=opts.shift_roots)
        inference = shifts if inference is None else itertools.chain(inference, shifts)
    for cell, parts, loop_metrics, dataset_meta, timing in inference or ():
        rank0_until_done(queue.finish(cell, parts, loop_metrics, dataset_meta, timing)
                          if queue is not None else None)
    # NOTE: what this run did only: a rerun that inferred no corruption cell keeps the loader
    # the inferring run recorded
    return {'loader': loader_kind, **loading} if corrupted else loading


def _finish_results(results: RobustnessResults, plan: Plan, loading: Dict[str, str],
                    wall: float) -> None:
    """Rank 0, every cell recorded.

    The worst case over attacks, how the cells were loaded, where the time went; the file saved.
    """
    _add_worst_case(results)
    results.data.update(loading)
    if all(results.done(c, s) for c, s in planned_cells(results.identity)):
        results.data.pop('partial', None)  # NOTE: a partial merge, completed by this run
    if not plan.infer and not plan.saved:  # NOTE: nothing left to do: the file keeps the time
        results.save()  # of the run that did the work
        print_log('every planned cell was recorded already: nothing inferred or computed',
                  logger='current')
        return
    summary = _time_summary(results, plan, wall)
    results.data['time'] = summary
    results.save()
    print_log('where the time went: ' + ', '.join(
        f'{k[:-2]} {v} s ({summary["shares"][k]:.0%})' for k, v in summary.items()
        if k in summary['shares']) + f'; wall {summary["wall_s"]} s', logger='current')


def _add_worst_case(results: RobustnessResults) -> None:
    """Rank 0, every cell recorded.

    The per-image worst case over the attacks (:mod:`.worst_case`), logged with the budgets that
    cannot have one and why.
    """
    attacks = list(results.data.get('attacks') or {})
    if len(attacks) < 2:
        return
    before = set(results.data['cells'].get(WORST, {}))
    skipped = add_worst_case(results.path, results.data)
    added = sorted(set(results.data['cells'].get(WORST, {})) - before, key=int)
    if added:
        print_log(f'worst case over {", ".join(attacks)} per image: cell(s) {WORST} '
                  f'{", ".join(added)} recorded', logger='current')
    for k, why in skipped.items():
        print_log(f'no worst-case cell at budget {k}: {why}', logger='current', level=30)


def _image_roots(cfg: Config, corrupted_root: Optional[str], cell: Tuple[str, int],
                 shift_roots: Optional[Dict[str, str]] = None) -> Tuple[str, ...]:
    """Folders under which an image's relative path is the same in every cell.

    The stored set's folder of ``cell``, then the datasets' data roots.
    """
    if is_shift_cell(cell[0]):  # NOTE: its own set: paths relative to its root
        loader = shift_dataloader(cfg, cell, shift_roots)
        return (str(leaf_datasets(loader['dataset'])[0]['data_root']), )
    roots = [cell_folder(corrupted_root, *cell)] if corrupted_root else []
    for dataset in leaf_datasets(cfg.test_dataloader['dataset']):
        if dataset.get('data_root'):
            roots.append(str(dataset['data_root']))
    return tuple(roots)


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
