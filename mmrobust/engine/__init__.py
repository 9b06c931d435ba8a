"""Training-loop pieces: the DAT, strict-load and tokenizer-export hooks, optimiser wrappers."""
from .hooks import DATHook, StrictLoadHook, TokenizerExportHook
from .optim_wrapper import CPUAmpOptimWrapper, VQOptimWrapperConstructor

__all__ = ['CPUAmpOptimWrapper', 'DATHook', 'StrictLoadHook', 'TokenizerExportHook',
           'VQOptimWrapperConstructor']
