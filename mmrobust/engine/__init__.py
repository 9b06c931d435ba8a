from .hooks import DATHook, PixelSpace
from .optim_wrapper import CPUAmpOptimWrapper

__all__ = ['CPUAmpOptimWrapper', 'DATHook', 'PixelSpace']
