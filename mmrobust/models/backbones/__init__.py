from . import drvit, fan, fan_swin
from .drvit import DrViT
from .fan import FANHybrid
from .fan_swin import FANSwin

__all__ = ['DrViT', 'FANHybrid', 'FANSwin', 'drvit', 'fan', 'fan_swin']
