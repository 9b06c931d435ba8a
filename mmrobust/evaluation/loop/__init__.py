"""The robustness run's test loop.

:class:`~mmrobust.engine.runner.OverlappedTestLoop` (registered: any config's ``test_cfg`` can
name it) is mmengine's ``TestLoop`` as named steps, with each batch preprocessed ahead and
post-processed behind the model; :class:`~.overlapped.InferenceLoop`'s ``run()`` stops before the
metrics (the metric worker computes them). :mod:`.cells` runs the cells with it: a dataloader per
cell, or every cell in one pass.
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
