"""Robustness evaluation (corruption cells, results files), its metrics and its reports."""
from ..utils.io import ResultsMismatchError
from .cell_kinds import builtin as _builtin  # noqa: F401  (the built-in kinds, in run order)
from .cells import CLEAN, cell_dataloader
from .coco_metric import COCO_BACKENDS, RobustCocoMetric, coco_backend
from .dump import DumpRobustPredictions
from .evaluator_cfg import PipelineError, find_loading_step
from .metric_worker import MetricWorkerError
from .metrics import robustness_summary
from .rank0 import results_lock
from .results import RESULTS_FORMAT, RobustnessResults, load_results, report_dir
from .robustness import (
    DEFAULT_METRIC_QUEUE,
    RobustnessOptions,
    evaluate_robustness,
    recorded_results,
)
from .seg_metric import FastIoUMetric
from .vq_metric import VQReconstructionMetric

__all__ = ['CLEAN', 'COCO_BACKENDS', 'DEFAULT_METRIC_QUEUE', 'DumpRobustPredictions',
           'FastIoUMetric', 'MetricWorkerError',
           'RESULTS_FORMAT', 'RobustCocoMetric', 'coco_backend', 'PipelineError',
           'ResultsMismatchError', 'RobustnessOptions', 'RobustnessResults', 'cell_dataloader',
           'evaluate_robustness', 'find_loading_step', 'load_results', 'recorded_results',
           'report_dir', 'results_lock',
           'robustness_summary', 'VQReconstructionMetric']
