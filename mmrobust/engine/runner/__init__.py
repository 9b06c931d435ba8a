"""Loops of mmengine's runner: the test and validation loops with the host's work overlapped."""
from .loops import (
    DEFAULT_POST_PROCESS_QUEUE,
    DEFAULT_PREFETCH,
    BatchPrefetcher,
    OverlappedTestLoop,
    OverlappedValLoop,
    PostProcessThread,
    split_step,
    split_test_step,
)

__all__ = ['DEFAULT_POST_PROCESS_QUEUE', 'DEFAULT_PREFETCH', 'BatchPrefetcher',
           'OverlappedTestLoop', 'OverlappedValLoop', 'PostProcessThread', 'split_step',
           'split_test_step']
