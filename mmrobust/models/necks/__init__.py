"""Necks: EfficientDet's BiFPN."""
from .bifpn import BiFPN

__all__ = ['BiFPN']
