from .dat import DATHook
from .strict_load import StrictLoadHook

__all__ = ['DATHook', 'StrictLoadHook']
