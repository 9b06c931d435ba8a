"""Models: backbones, heads, necks, tokenizers, data preprocessors and checkpoint loading."""
# NOTE: importing the subpackages registers their modules in the mmdet and mmseg registries
from . import (  # noqa: F401
    backbones,
    checkpoint,
    data_preprocessors,
    dense_heads,
    layers,
    necks,
    tokenizers,
)
from .backbones import DrViT, EfficientNetLite, FANHybrid, FANSwin
from .dense_heads import EfficientDetHead
from .necks import BiFPN
from .tokenizers import VQGAN

__all__ = ['BiFPN', 'DrViT', 'EfficientDetHead', 'EfficientNetLite', 'FANHybrid', 'FANSwin',
           'VQGAN']
