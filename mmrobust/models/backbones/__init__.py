from . import fan, fan_swin
from .fan import FANHybrid
from .fan_swin import FANSwin

__all__ = ['FANHybrid', 'FANSwin', 'fan', 'fan_swin']
