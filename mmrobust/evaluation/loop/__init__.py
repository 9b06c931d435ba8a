"""The robustness run's test loop, written once.

:class:`~.overlapped.OverlappedTestLoop` is mmengine's ``TestLoop`` as named steps, with each
batch preprocessed ahead and post-processed behind the model; its ``run()`` drains before it
computes metrics, and :class:`~.overlapped.InferenceLoop`'s stops before them (the metric
worker computes them). :mod:`.cells` runs the cells with it: a dataloader per cell, or every
cell in one pass. mmengine's private names and ``runner._test_loop`` are used here only.
"""
from .cells import iterate_one_pass, loading_share, per_cell_cells
from .overlapped import (
    DEFAULT_POST_PROCESS_QUEUE,
    DEFAULT_PREFETCH,
    BatchPrefetcher,
    InferenceLoop,
    OverlappedTestLoop,
    PostProcessThread,
    gather_parts,
    split_test_step,
)

__all__ = ['DEFAULT_POST_PROCESS_QUEUE', 'DEFAULT_PREFETCH', 'BatchPrefetcher', 'InferenceLoop',
           'OverlappedTestLoop', 'PostProcessThread', 'gather_parts', 'iterate_one_pass',
           'loading_share', 'per_cell_cells', 'split_test_step']
