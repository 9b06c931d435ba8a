"""The robust backbones: FAN-Hybrid, FAN-Swin, Dr-ViT and EfficientNet-Lite."""
from . import drvit, fan, fan_swin
from .drvit import DrViT
from .efficientnet_lite import EfficientNetLite
from .fan import FANHybrid
from .fan_swin import FANSwin

__all__ = ['DrViT', 'EfficientNetLite', 'FANHybrid', 'FANSwin', 'drvit', 'fan', 'fan_swin']
