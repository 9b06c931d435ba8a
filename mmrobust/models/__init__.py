from . import backbones, efficientdet, layers, tokenizers  # noqa: F401  (registers the models)
from .backbones import DrViT, FANHybrid, FANSwin
from .efficientdet import BiFPN, EfficientDetHead, EfficientNetLite
from .tokenizers import VQGAN

__all__ = ['BiFPN', 'DrViT', 'EfficientDetHead', 'EfficientNetLite', 'FANHybrid', 'FANSwin',
           'VQGAN']
