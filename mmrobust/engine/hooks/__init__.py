from .dat import DATHook

__all__ = ['DATHook']
