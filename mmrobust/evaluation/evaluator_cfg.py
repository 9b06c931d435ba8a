"""Every edit a robustness run makes to an evaluator config or a test pipeline, in one place.

A metric's or a transform's type is read by :func:`type_name` only (a string with or without
its scope, ``mmseg.IoUMetric``; a class; an instance), so a scoped name is what its unscoped
one is. The run's evaluator: the COCO backend chosen (:func:`select_coco_backend`), mmseg's IoU
counted by :class:`~.seg_metric.FastIoUMetric` (:func:`use_fast_iou`), per-image statistics on
(:func:`with_per_image`), metrics that write files found (:func:`side_file_metrics`) and given
each cell's own folder (:func:`cell_metric_outputs`), ground-truth masks no metric reads left
undecoded (:func:`without_unread_gt_masks`); the pipeline's image-loading step found by type
(:func:`find_loading_step`). :mod:`.coco_metric` and :mod:`.seg_metric` hold only the metrics.
"""
import copy
import os.path as osp
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from mmengine.config import Config

from ..utils.config_checks import leaf_datasets
from ..utils.errors import ConfigError, MMRobustError
from .coco_metric import coco_backend

__all__ = ['ANNOTATION_LOADERS', 'FILE_WRITING_METRICS', 'PER_IMAGE_METRICS', 'PipelineError',
           'annotation_steps', 'cell_metric_outputs',
           'find_loading_step', 'is_coco_metric', 'metric_entries', 'select_coco_backend',
           'side_file_metrics', 'transform_names', 'type_name', 'use_fast_iou', 'with_per_image',
           'without_backend', 'without_unread_gt_masks']

#: mmdet's and mmrobust's COCO metrics, by type name
COCO_METRICS = ('CocoMetric', 'RobustCocoMetric')
#: Metrics that write files in ``process()`` (read back in ``compute_metrics``), by type name:
#: mmseg's and mmdet's Cityscapes metrics, and mmdet's COCO panoptic metric (its PNGs; the
#: folder derives from ``outfile_prefix`` when the metric is built, hence one per cell)
FILE_WRITING_METRICS = ('CityscapesMetric', 'CityScapesMetric', 'CocoPanopticMetric')
#: Metrics that keep per-image statistics when asked (``per_image=True``), by type name.
PER_IMAGE_METRICS = ('RobustCocoMetric', 'FastIoUMetric')


def type_name(item: Any) -> str:
    """The type name of a config (its ``type``), a class or an instance, without its scope.

    ``dict(type='mmseg.IoUMetric')``, ``dict(type=IoUMetric)`` and an ``IoUMetric()`` are all
    ``IoUMetric``.
    """
    if isinstance(item, Mapping):
        item = item.get('type', '')
    if isinstance(item, str):
        return item.split('.')[-1]
    return (item if isinstance(item, type) else type(item)).__name__


# -- metrics ---------------------------------------------------------------------------------------

def metric_entries(evaluator: Any) -> List[Dict]:
    """The metric configs of an evaluator config (a metric, a list, or ``dict(metrics=...)``)."""
    if isinstance(evaluator, (list, tuple)):
        return [m for e in evaluator for m in metric_entries(e)]
    if isinstance(evaluator, dict) and 'metrics' in evaluator:
        return metric_entries(evaluator['metrics'])
    return [evaluator] if isinstance(evaluator, dict) else []


def is_coco_metric(entry: Dict) -> bool:
    """Whether a metric config is mmdet's or mmrobust's COCO metric (scoped or not)."""
    return type_name(entry) in COCO_METRICS


def select_coco_backend(evaluator: Any, backend: Optional[str] = None,
                        default: Optional[str] = None) -> Tuple[Any, List[str]]:
    """Evaluate every COCO metric of an evaluator config with a chosen COCO library.

    Args:
        evaluator: a ``test_evaluator`` config; changed in place.
        backend: the user's choice (``--coco-backend``) for every COCO metric.
        default: without ``backend``, the backend of a COCO metric that names none (a metric's
            own ``backend=...`` wins); None leaves such a metric mmdet's.

    Returns:
        The evaluator config and the backends used (``'name version'``), one per COCO metric.

    Raises:
        UnknownBackendError, BackendNotInstalledError: as :func:`~.coco_metric.coco_backend`.
    """
    labels = []
    for entry in metric_entries(evaluator):
        if not is_coco_metric(entry):
            continue
        chosen = backend or entry.get('backend') or default
        if chosen is None:
            chosen = 'mmdet-mp' if entry.get('use_mp_eval') else 'pycocotools'
            labels.append(coco_backend(chosen).label)
            continue
        labels.append(coco_backend(chosen).label)  # NOTE: fails here, before any inference
        entry.pop('use_mp_eval', None)
        entry['type'] = 'RobustCocoMetric'
        entry['backend'] = chosen
    return evaluator, labels


def without_backend(evaluator: Any) -> Any:
    """A copy of an evaluator config without its COCO metrics' ``backend`` keys.

    The backend changes how fast the numbers come, not what they are (for fingerprints of what is
    evaluated).
    """
    evaluator = copy.deepcopy(evaluator)
    for entry in metric_entries(evaluator):
        if is_coco_metric(entry):
            entry.pop('backend', None)
            entry.pop('use_mp_eval', None)
            if type_name(entry) == 'RobustCocoMetric':
                entry['type'] = 'CocoMetric'
    return evaluator


def use_fast_iou(evaluator: Any) -> Tuple[Any, int]:
    """Make every ``IoUMetric`` of an evaluator config a :class:`~.seg_metric.FastIoUMetric`.

    In place; returns the config and how many were replaced.
    """
    count = 0
    for entry in metric_entries(evaluator):
        if type_name(entry) == 'IoUMetric':
            entry['type'] = 'FastIoUMetric'
            count += 1
    return evaluator, count


def with_per_image(evaluator: Any) -> Any:
    """Every metric of :data:`PER_IMAGE_METRICS` keeps its per-image statistics (in place)."""
    for entry in metric_entries(evaluator):
        if type_name(entry) in PER_IMAGE_METRICS:
            entry['per_image'] = True
    return evaluator


def side_file_metrics(evaluator_cfg: Any) -> Optional[str]:
    """Why the cells need a dataloader each (None: they do not).

    A metric that writes files in ``process()`` (``output_dir``, or a type of
    :data:`FILE_WRITING_METRICS`) must write each cell's into the cell's own folder
    (:func:`cell_metric_outputs`), and one evaluator serves every cell of the one-pass loop.

    Raises:
        ConfigError: a metric is ``format_only`` (it writes files for a test server and gives
            no number to record).
    """
    writers = []
    for entry in metric_entries(evaluator_cfg):
        if entry.get('format_only'):
            raise ConfigError(
                f'the metric {type_name(entry)} is format_only: it writes files for a test '
                'server and gives no number, and a robustness run records numbers per cell. '
                'Set format_only=False in test_evaluator (on a split with annotations).')
        if entry.get('output_dir') or type_name(entry) in FILE_WRITING_METRICS:
            writers.append(type_name(entry))
    if writers:
        return (f'{", ".join(writers)} write files as they process each batch: each cell '
                'builds its own evaluator, writing into its own folder')
    return None


def cell_metric_outputs(evaluator_cfg: Any, cell: Tuple[str, int]) -> Any:
    """The evaluator config with every metric's output made the cell's own.

    In place: ``outfile_prefix`` becomes ``<prefix>_<corruption>_<severity>`` and ``output_dir``
    ``<output_dir>/<corruption>_<severity>``, so no cell reads or overwrites another's.
    """
    for entry in metric_entries(evaluator_cfg):
        if entry.get('outfile_prefix'):
            entry['outfile_prefix'] = f'{entry["outfile_prefix"]}_{cell[0]}_{cell[1]}'
        if entry.get('output_dir'):
            entry['output_dir'] = osp.join(entry['output_dir'], f'{cell[0]}_{cell[1]}')
    return evaluator_cfg


def _mask_loads(cfg: Config) -> List[Dict]:
    """The test pipelines' ``LoadAnnotations`` steps that decode instance masks."""
    return [step for dataset in leaf_datasets(cfg.test_dataloader['dataset'])
            for step in dataset.get('pipeline') or []
            if isinstance(step, dict) and type_name(step) == 'LoadAnnotations'
            and step.get('with_mask')]


def without_unread_gt_masks(cfg: Config, evaluator_cfg: Any) -> Tuple[Config, Optional[str]]:
    """The config whose test pipeline does not decode ground-truth masks when no metric reads them.

    Also returns what was decided (None: the pipeline decodes none).

    A COCO metric with an ``ann_file`` scores against the file, never against the decoded
    bitmaps (N x H x W per image, rasterised in the dataloader workers and sent to the loop:
    ~9 ms per COCO image to receive). Any other metric may read them, and then they stay.
    Attack cells, whose loss needs them, keep the config's own pipeline.
    """
    if not _mask_loads(cfg):
        return cfg, None
    readers = [type_name(entry) for entry in metric_entries(evaluator_cfg)
               if not (is_coco_metric(entry) and entry.get('ann_file'))
               and type_name(entry) != 'DumpRobustPredictions']
    if readers:
        return cfg, f'decoded ({", ".join(readers)} may read them)'
    cfg = copy.deepcopy(cfg)
    for step in _mask_loads(cfg):
        step['with_mask'] = False
    return cfg, 'not decoded (every metric scores against its annotation file)'


# -- pipelines -------------------------------------------------------------------------------------

class PipelineError(MMRobustError, ValueError):
    """The test pipeline cannot be corrupted (no image-loading step)."""


def transform_names(pipeline: Sequence) -> List[str]:
    """The type names of a pipeline's transforms (configs, classes or instances), unscoped."""
    return [type_name(step) for step in pipeline]


#: The transforms that load ground truth, by type name: mmdet's / mmseg's ``LoadAnnotations`` and
#: mmdet's ``LoadPanopticAnnotations`` (instances and the label map of a panoptic set)
ANNOTATION_LOADERS = ('LoadAnnotations', 'LoadPanopticAnnotations')


def annotation_steps(pipeline: Sequence) -> List[int]:
    """Indices of a pipeline's ground-truth loading steps (:data:`ANNOTATION_LOADERS`)."""
    return [i for i, kind in enumerate(transform_names(pipeline)) if kind in ANNOTATION_LOADERS]


def find_loading_step(pipeline: List[Dict]) -> int:
    """Index of the image-loading transform (``LoadImageFromFile`` and kin), found by type."""
    for i, kind in enumerate(transform_names(pipeline)):
        if kind.startswith('LoadImageFrom'):
            return i
    raise PipelineError(
        f'The test pipeline has no image-loading step (LoadImageFromFile or similar), so there '
        f'is no place to corrupt the images: {transform_names(pipeline)}. Add one, or evaluate '
        'a stored corrupted set with --corrupted-root.')
