"""Each cell's evaluator config: the run's (:mod:`.evaluator_cfg`), made the cell's own.

The config's own, its COCO backend chosen, mmseg's IoU counted by
:class:`~.seg_metric.FastIoUMetric`, per-image statistics on, what the cell's kind changes, and
every output (a metric's files, the predictions dump) made the cell's own.
"""
import copy
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from mmengine.config import Config

from .cell_kinds import Cell, RunSpec, kind_of
from .coco_metric import DEFAULT_ROBUSTNESS_BACKEND
from .evaluator_cfg import (
    cell_metric_outputs,
    metric_entries,
    select_coco_backend,
    use_fast_iou,
    with_per_image,
)
from .results import ResultsLayout

__all__ = ['CellEvaluators']


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
            evaluator = with_per_image(evaluator)
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
