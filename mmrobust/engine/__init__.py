from .hooks import DATHook, StrictLoadHook
from .optim_wrapper import CPUAmpOptimWrapper

__all__ = ['CPUAmpOptimWrapper', 'DATHook', 'StrictLoadHook']
