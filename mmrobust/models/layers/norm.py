"""Normalisation layers."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from typing_extensions import override


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (ConvNeXt).

    Args:
        num_channels: Channels.
        eps: Added to the variance.
        unbiased: Normalise by the unbiased (C - 1) variance. The ConvNeXt stem of the released
            FAN-Hybrid weights was trained with timm 0.5's LayerNorm2d, which takes that path
            for every input that is not contiguous, i.e. for all but its first norm.
    """

    def __init__(self, num_channels: int, eps: float = 1e-6, unbiased: bool = False) -> None:
        super().__init__(num_channels, eps=eps)
        self.unbiased = unbiased

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, eps = self.weight, self.eps
        if self.unbiased:
            # NOTE: (x - m) / sqrt(var_u + eps) == s * (x - m) / sqrt(var_b + s² eps) with
            # s² = (C - 1) / C, so the fused kernel still applies
            c = x.shape[1]
            weight, eps = weight * ((c - 1) / c) ** 0.5, eps * (c - 1) / c
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, weight, self.bias, eps)
        return x.permute(0, 3, 1, 2)
