"""Runner pieces: the DAT, strict-load and tokenizer-export hooks, optimiser wrappers, loops."""
from .hooks import DATHook, StrictLoadHook, TokenizerExportHook
from .optim_wrapper import CPUAmpOptimWrapper, VQOptimWrapperConstructor
from .runner import OverlappedTestLoop, OverlappedValLoop

__all__ = ['CPUAmpOptimWrapper', 'DATHook', 'OverlappedTestLoop', 'OverlappedValLoop',
           'StrictLoadHook', 'TokenizerExportHook', 'VQOptimWrapperConstructor']
