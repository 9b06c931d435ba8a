from .efficientdet_head import EfficientDetHead

__all__ = ['EfficientDetHead']
