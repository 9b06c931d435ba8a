"""Dense heads: EfficientDet's class / box head."""
from .efficientdet_head import EfficientDetHead

__all__ = ['EfficientDetHead']
