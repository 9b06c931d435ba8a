"""Each cell's evaluator config.

The config's own, its COCO backend chosen, mmseg's IoU counted by
:class:`~.seg_metric.FastIoUMetric`, per-image statistics on, and every output (a metric's files,
the predictions dump) made the cell's own.
"""
import copy
import os.path as osp
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from mmengine.config import Config

from ..utils.config_checks import leaf_datasets
from .cell_kinds import Cell, RunSpec, kind_of
from .coco_metric import (
    DEFAULT_ROBUSTNESS_BACKEND,
    is_coco_metric,
    metric_entries,
    select_coco_backend,
)
from .results import ResultsLayout
from .seg_metric import use_fast_iou

__all__ = ['FILE_WRITING_METRICS', 'CellEvaluators', 'cell_metric_outputs', 'side_file_metrics',
           'without_unread_gt_masks']


#: Metrics that write files in ``process()`` (read back in ``compute_metrics``), by type name.
FILE_WRITING_METRICS = ('CityscapesMetric', 'CityScapesMetric')


def _type_name(entry: Dict) -> str:
    kind = entry.get('type', '')
    return (kind if isinstance(kind, str) else getattr(kind, '__name__', '')).split('.')[-1]


def side_file_metrics(evaluator_cfg: Any) -> Optional[str]:
    """Why the cells need a dataloader each (None: they do not).

    A metric that writes files in ``process()`` (``output_dir``, or a type of
    :data:`FILE_WRITING_METRICS`) must write each cell's into the cell's own folder
    (:func:`cell_metric_outputs`), and one evaluator serves every cell of the one-pass loop.

    Raises:
        ConfigError: a metric is ``format_only`` (it writes files for a test server and gives
            no number to record).
    """
    from ..utils.errors import ConfigError
    writers = []
    for entry in metric_entries(evaluator_cfg):
        if entry.get('format_only'):
            raise ConfigError(
                f'the metric {_type_name(entry)} is format_only: it writes files for a test '
                'server and gives no number, and a robustness run records numbers per cell. '
                'Set format_only=False in test_evaluator (on a split with annotations).')
        if entry.get('output_dir') or _type_name(entry) in FILE_WRITING_METRICS:
            writers.append(_type_name(entry))
    if writers:
        return (f'{", ".join(writers)} write files as they process each batch: each cell '
                'builds its own evaluator, writing into its own folder')
    return None


def cell_metric_outputs(evaluator_cfg: Any, cell: Tuple[str, int]) -> Any:
    """The evaluator config with every metric's output made the cell's own.

    The evaluator config with every metric's output (``outfile_prefix``, ``output_dir``) made the
    cell's own (in place): ``<prefix>_<corruption>_<severity>`` and
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
            if isinstance(step, dict) and str(step.get('type', '')).split('.')[-1]
            == 'LoadAnnotations' and step.get('with_mask')]


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
    readers = [_type_name(entry) for entry in metric_entries(evaluator_cfg)
               if not (is_coco_metric(entry) and entry.get('ann_file'))
               and _type_name(entry) != 'DumpRobustPredictions']
    if readers:
        return cfg, f'decoded ({", ".join(readers)} may read them)'
    cfg = copy.deepcopy(cfg)
    for step in _mask_loads(cfg):
        step['with_mask'] = False
    return cfg, 'not decoded (every metric scores against its annotation file)'


@dataclass
class CellEvaluators:
    """Each cell's evaluator config.

    The config's, its COCO backend chosen, FastIoU for IoU, per-image statistics on, its outputs
    made the cell's own, what the cell's kind changes (a detection shift cell's COCO metrics
    score against its set's annotation file: :meth:`~.cell_kinds.CellKind.evaluator`), and the
    predictions dump.
    """
    evaluator: Any
    backends: List[str]
    save_predictions: Optional[str]
    spec: Optional[RunSpec] = None

    @classmethod
    def build(cls, cfg: Config, opts: Any, spec: Optional[RunSpec] = None) -> 'CellEvaluators':
        """The cells' evaluators of ``cfg`` with the run's options (backend chosen here)."""
        # NOTE: an unknown or missing backend stops here, before any inference
        evaluator, backends = select_coco_backend(copy.deepcopy(cfg.test_evaluator),
                                                  opts.coco_backend, DEFAULT_ROBUSTNESS_BACKEND)
        evaluator, _ = use_fast_iou(evaluator)  # NOTE: mmseg's numbers, cheaper per image
        if opts.per_image:
            for entry in metric_entries(evaluator):
                if entry.get('type') in ('RobustCocoMetric', 'FastIoUMetric'):
                    entry['per_image'] = True
        return cls(evaluator, list(backends), opts.save_predictions, spec)

    def __call__(self, cell: Cell) -> Tuple[Any, List[Dict]]:
        """The evaluator config of a cell and its metric configs, in the evaluator's order."""
        evaluator = cell_metric_outputs(copy.deepcopy(self.evaluator), cell)
        if self.spec is not None:
            evaluator = kind_of(cell[0]).evaluator(evaluator, cell, self.spec)
        if self.save_predictions:
            evaluator = list(evaluator) if isinstance(evaluator, (list, tuple)) else [evaluator]
            evaluator.append(dict(type='DumpRobustPredictions', out_file_path=(
                ResultsLayout.cell_file(self.save_predictions, *cell, 'pkl'))))
        return evaluator, metric_entries(evaluator)
