from .dat import DATHook, PixelSpace

__all__ = ['DATHook', 'PixelSpace']
