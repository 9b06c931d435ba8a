"""Robustness evaluation (corruption cells, results files) and its reports."""
from .robustness import (PipelineError, ResultsMismatchError, RobustnessResults, cell_dataloader,
                         evaluate_robustness, find_loading_step)

__all__ = ['PipelineError', 'ResultsMismatchError', 'RobustnessResults', 'cell_dataloader',
           'evaluate_robustness', 'find_loading_step']
