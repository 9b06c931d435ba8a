"""Robustness evaluation (corruption cells, results files), its metrics and its reports."""
from ..utils.io import ResultsMismatchError
from .coco_metric import COCO_BACKENDS, RobustCocoMetric, coco_backend
from .metrics import CLEAN, robustness_summary
from .robustness import (
    PipelineError,
    RobustnessResults,
    cell_dataloader,
    evaluate_robustness,
    find_loading_step,
    report_dir,
    results_lock,
)
from .seg_metric import FastIoUMetric
from .vq_metric import VQReconstructionMetric

__all__ = ['CLEAN', 'COCO_BACKENDS', 'FastIoUMetric', 'RobustCocoMetric', 'coco_backend',
           'PipelineError',
           'ResultsMismatchError', 'RobustnessResults',
           'cell_dataloader', 'evaluate_robustness', 'find_loading_step', 'report_dir',
           'results_lock', 'robustness_summary', 'VQReconstructionMetric']
