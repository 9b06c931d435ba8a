from . import backbones, layers  # noqa: F401  (registers the models)
from .backbones import FANHybrid, FANSwin

__all__ = ['FANHybrid', 'FANSwin']
