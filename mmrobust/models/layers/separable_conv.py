"""Depthwise-separable convolution and TensorFlow's BatchNorm settings (EfficientDet)."""
from typing import Optional

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from typing_extensions import override

__all__ = ['BN_TF', 'SeparableConv']

#: BatchNorm as TensorFlow's EfficientDet trains it (momentum 0.99 in TF's convention)
BN_TF = dict(type='BN', momentum=0.01, eps=1e-3)


class SeparableConv(nn.Module):
    """Depthwise 3x3 (no bias) → pointwise 1x1 (bias) → optional norm."""

    def __init__(self, in_chs: int, out_chs: int, norm_cfg: Optional[dict] = None) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(in_chs, in_chs, 3, padding=1, groups=in_chs, bias=False)
        self.pointwise = nn.Conv2d(in_chs, out_chs, 1)
        self.norm = build_norm_layer(norm_cfg, out_chs)[1] if norm_cfg else nn.Identity()

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.pointwise(self.depthwise(x)))
