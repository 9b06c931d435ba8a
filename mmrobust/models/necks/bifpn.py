"""BiFPN, EfficientDet's neck.

Tan et al., "EfficientDet: Scalable and Efficient Object Detection", CVPR 2020
(https://arxiv.org/abs/1911.09070). P3-P5 from the backbone, P6/P7 added by pooling, then
repeated weighted bidirectional (top-down, bottom-up) fusion with fast normalised weights.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_activation_layer, build_norm_layer
from mmengine.model import BaseModule
from typing_extensions import override

from ...registry import MODELS
from ..layers.separable_conv import BN_TF, SeparableConv

__all__ = ['BiFPN']


def _resample(in_chs: int, out_chs: int, norm_cfg: dict) -> nn.Module:
    """1x1 conv + norm that brings a backbone map to the BiFPN width."""
    return nn.Sequential(nn.Conv2d(in_chs, out_chs, 1), build_norm_layer(norm_cfg, out_chs)[1])


def _down(x: torch.Tensor) -> torch.Tensor:
    # NOTE: 3x3/2 max pooling gives ceil(n / 2), the size a stride-2 'same' conv produces
    return F.max_pool2d(x, 3, 2, 1)


class FusionNode(nn.Module):
    """Fast normalised fusion ``sum relu(w_i) x_i / (sum relu(w_i) + eps)`` → act → sep. conv."""

    def __init__(self, num_inputs: int, chs: int, norm_cfg: dict, act_cfg: dict,
                 weighted: bool = True) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.ones(num_inputs)) if weighted else None
        self.act = build_activation_layer(act_cfg)
        self.conv = SeparableConv(chs, chs, norm_cfg)

    def forward(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        if self.weights is None:
            fused = torch.stack(list(inputs)).sum(0)
        else:
            w = F.relu(self.weights)
            w = w / (w.sum() + 1e-4)
            fused = sum(w[i] * x for i, x in enumerate(inputs))
        return self.conv(self.act(fused))


class BiFPNLayer(nn.Module):
    """One top-down + bottom-up pass over ``num_levels`` maps of equal width."""

    def __init__(self, num_levels: int, chs: int, norm_cfg: dict, act_cfg: dict,
                 weighted: bool) -> None:
        super().__init__()
        self.num_levels = num_levels
        # top_down[i] makes intermediate level i (0 = finest) for i < num_levels - 1
        self.top_down = nn.ModuleList(FusionNode(2, chs, norm_cfg, act_cfg, weighted)
                                      for _ in range(num_levels - 1))
        # bottom_up[i - 1] makes output level i >= 1; the inner ones fuse three inputs
        self.bottom_up = nn.ModuleList(
            FusionNode(3 if i < num_levels - 1 else 2, chs, norm_cfg, act_cfg, weighted)
            for i in range(1, num_levels))

    def forward(self, feats: List[torch.Tensor], bu_feats: Optional[List[torch.Tensor]] = None
                ) -> List[torch.Tensor]:
        """``bu_feats``: the inputs of the bottom-up nodes when they differ.

        The first layer resamples backbone maps separately for each path, as the official model.
        """
        bu_feats = feats if bu_feats is None else bu_feats
        n = self.num_levels
        td = [None] * n
        td[-1] = feats[-1]
        for i in range(n - 2, -1, -1):
            up = F.interpolate(td[i + 1], size=feats[i].shape[-2:], mode='nearest')
            td[i] = self.top_down[i]([feats[i], up])
        outs = [td[0]]
        for i in range(1, n):
            down = _down(outs[-1])
            inputs = [bu_feats[i], td[i], down] if i < n - 1 else [bu_feats[i], down]
            outs.append(self.bottom_up[i - 1](inputs))
        return outs


@MODELS.register_module()
class BiFPN(BaseModule):
    """Weighted bidirectional FPN.

    Args:
        in_channels: channels of the backbone maps (finest first), e.g. B0's P3-P5 (40, 112, 320).
        out_channels: BiFPN width (64 for D0).
        num_layers: stacked BiFPN layers (3 for D0).
        num_outs: output levels; the ones above the backbone's come from 1x1 conv + pooling on
            the last map, then pooling.
        norm_cfg: norm of the separable and resampling convs (TF-style BN by default).
        act_cfg: activation before each fusion conv (Swish; ReLU6 for the Lite models).
        weighted: fast normalised fusion weights (False: plain sum).
    """

    def __init__(self, in_channels: Sequence[int], out_channels: int = 64, num_layers: int = 3,
                 num_outs: int = 5, norm_cfg: dict = BN_TF, act_cfg: dict = dict(type='Swish'),
                 weighted: bool = True, init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if num_outs < len(in_channels):
            raise ValueError(f'num_outs ({num_outs}) must cover the {len(in_channels)} inputs')
        self.in_channels, self.out_channels, self.num_outs = list(in_channels), out_channels, \
            num_outs
        self.lateral = nn.ModuleList(
            _resample(c, out_channels, norm_cfg) if c != out_channels else nn.Identity()
            for c in in_channels)
        # the bottom-up path of the first layer resamples the inner backbone maps again
        self.lateral_bu = nn.ModuleList(
            _resample(c, out_channels, norm_cfg) if c != out_channels else nn.Identity()
            for c in in_channels[1:])
        extra = num_outs - len(in_channels)
        self.extra = (_resample(in_channels[-1], out_channels, norm_cfg)
                      if extra and in_channels[-1] != out_channels else nn.Identity())
        self.layers = nn.ModuleList(BiFPNLayer(num_outs, out_channels, norm_cfg, act_cfg, weighted)
                                    for _ in range(num_layers))

    @override
    def forward(self, inputs: Tuple[torch.Tensor, ...]) -> Tuple[torch.Tensor, ...]:
        if len(inputs) != len(self.in_channels):
            raise ValueError(f'BiFPN expects {len(self.in_channels)} maps, got {len(inputs)}')
        feats = [conv(x) for conv, x in zip(self.lateral, inputs)]
        bu = feats[:1] + [conv(x) for conv, x in zip(self.lateral_bu, inputs[1:])]
        if self.num_outs > len(inputs):
            extra = _down(self.extra(inputs[-1]))
            for _ in range(self.num_outs - len(inputs)):
                feats.append(extra)
                bu.append(extra)
                extra = _down(extra)
        for i, layer in enumerate(self.layers):
            feats = layer(feats, bu if i == 0 else None)
        return tuple(feats)
