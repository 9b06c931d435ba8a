from . import backbones, layers, tokenizers  # noqa: F401  (registers the models)
from .backbones import DrViT, FANHybrid, FANSwin
from .tokenizers import VQGAN

__all__ = ['DrViT', 'FANHybrid', 'FANSwin', 'VQGAN']
