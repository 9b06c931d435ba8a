"""EfficientDet: BiFPN neck, class/box head, and the EfficientNet-Lite backbone.

Tan et al., "EfficientDet: Scalable and Efficient Object Detection", CVPR 2020
(https://arxiv.org/abs/1911.09070). DAT's paper trains EfficientDet-D0 and -Lite0 detectors.
The backbone is mmdet's ``EfficientNet`` (B0) or :class:`EfficientNetLite` (no squeeze-excite,
ReLU6); P3-P5 feed a :class:`BiFPN` that adds P6/P7 by pooling and repeats weighted
bidirectional fusion; :class:`EfficientDetHead` shares its separable convs across levels but
keeps one BatchNorm per level. D0 (B0, 64 channels, 3 BiFPN layers, 3 head layers, 90 classes)
has 3.88M parameters, the paper's 3.9M.
"""
import math
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_activation_layer, build_norm_layer
from mmdet.models.backbones import EfficientNet
from mmdet.models.dense_heads import AnchorHead
from mmengine.model import BaseModule

from ..registry import MODELS

__all__ = ['SeparableConv', 'BiFPN', 'EfficientDetHead', 'EfficientNetLite']

BN_TF = dict(type='BN', momentum=0.01, eps=1e-3)  # TensorFlow's BN momentum 0.99


class SeparableConv(nn.Module):
    """Depthwise 3x3 (no bias) → pointwise 1x1 (bias) → optional norm."""

    def __init__(self, in_chs: int, out_chs: int, norm_cfg: Optional[dict] = None) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(in_chs, in_chs, 3, padding=1, groups=in_chs, bias=False)
        self.pointwise = nn.Conv2d(in_chs, out_chs, 1)
        self.norm = build_norm_layer(norm_cfg, out_chs)[1] if norm_cfg else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.pointwise(self.depthwise(x)))


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
        """``bu_feats``: the inputs of the bottom-up nodes when they differ (the first layer
        resamples backbone maps separately for each path, as the official model)."""
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


@MODELS.register_module()
class EfficientDetHead(AnchorHead):
    """EfficientDet's class and box nets: separable convs shared across levels, one BN per level
    and layer, a separable-conv predictor (focal loss, 9 anchors per position).

    Args:
        num_classes: object classes.
        in_channels: BiFPN width.
        feat_channels: head width (the BiFPN width in the paper).
        stacked_convs: separable conv layers before each predictor (3 for D0).
        num_levels: pyramid levels (P3-P7).
        norm_cfg / act_cfg: per-level norm, activation (Swish; ReLU6 for the Lite models).
        prior_prob: initial foreground probability of the class predictor.
        anchor_generator, bbox_coder, loss_cls, loss_bbox, train_cfg, test_cfg, init_cfg:
            as mmdet's :class:`AnchorHead`.
    """

    def __init__(self, num_classes: int, in_channels: int, feat_channels: int = 64,
                 stacked_convs: int = 3, num_levels: int = 5, norm_cfg: dict = BN_TF,
                 act_cfg: dict = dict(type='Swish'), prior_prob: float = 0.01,
                 anchor_generator: dict = dict(type='AnchorGenerator', octave_base_scale=4,
                                               scales_per_octave=3, ratios=[0.5, 1.0, 2.0],
                                               strides=[8, 16, 32, 64, 128]),
                 bbox_coder: dict = dict(type='DeltaXYWHBBoxCoder',
                                         target_means=[0., 0., 0., 0.],
                                         target_stds=[1., 1., 1., 1.]),
                 loss_cls: dict = dict(type='FocalLoss', use_sigmoid=True, gamma=1.5, alpha=0.25,
                                       loss_weight=1.0),
                 # NOTE: the official Huber(0.1) x 50 / (4 n_pos) is smooth-L1(0.1) x 1.25 / n_pos
                 loss_bbox: dict = dict(type='SmoothL1Loss', beta=0.1, loss_weight=1.25),
                 train_cfg: Optional[dict] = None, test_cfg: Optional[dict] = None,
                 init_cfg: Optional[dict] = dict(type='Normal', layer='Conv2d', std=0.01)
                 ) -> None:
        self.stacked_convs, self.num_levels = stacked_convs, num_levels
        self.norm_cfg, self.act_cfg, self.prior_prob = norm_cfg, act_cfg, prior_prob
        super().__init__(num_classes=num_classes, in_channels=in_channels,
                         feat_channels=feat_channels, anchor_generator=anchor_generator,
                         bbox_coder=bbox_coder, loss_cls=loss_cls, loss_bbox=loss_bbox,
                         train_cfg=train_cfg, test_cfg=test_cfg, init_cfg=init_cfg)
        if self.prior_generator.num_levels != num_levels:
            raise ValueError(f'the anchor generator has {self.prior_generator.num_levels} '
                             f'strides but num_levels={num_levels}')

    def _branch(self) -> Tuple[nn.ModuleList, nn.ModuleList]:
        convs = nn.ModuleList(
            SeparableConv(self.in_channels if i == 0 else self.feat_channels, self.feat_channels)
            for i in range(self.stacked_convs))
        norms = nn.ModuleList(
            nn.ModuleList(build_norm_layer(self.norm_cfg, self.feat_channels)[1]
                          for _ in range(self.stacked_convs))
            for _ in range(self.num_levels))
        return convs, norms

    def _init_layers(self) -> None:
        self.cls_convs, self.cls_norms = self._branch()
        self.reg_convs, self.reg_norms = self._branch()
        self.act = build_activation_layer(self.act_cfg)
        self.cls_pred = SeparableConv(self.feat_channels,
                                      self.num_base_priors * self.cls_out_channels)
        self.reg_pred = SeparableConv(self.feat_channels,
                                      self.num_base_priors * self.bbox_coder.encode_size)

    def init_weights(self) -> None:
        super().init_weights()
        nn.init.constant_(self.cls_pred.pointwise.bias,
                          -math.log((1 - self.prior_prob) / self.prior_prob))

    def _run(self, x: torch.Tensor, level: int, convs: nn.ModuleList, norms: nn.ModuleList,
             pred: nn.Module) -> torch.Tensor:
        for conv, norm in zip(convs, norms[level]):
            x = self.act(norm(conv(x)))
        return pred(x)

    def forward(self, x: Tuple[torch.Tensor, ...]) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        if len(x) != self.num_levels:
            raise ValueError(f'EfficientDetHead expects {self.num_levels} levels, got {len(x)}')
        cls_scores = [self._run(f, i, self.cls_convs, self.cls_norms, self.cls_pred)
                      for i, f in enumerate(x)]
        bbox_preds = [self._run(f, i, self.reg_convs, self.reg_norms, self.reg_pred)
                      for i, f in enumerate(x)]
        return cls_scores, bbox_preds


def _without_se(settings: list) -> list:
    """mmdet's EfficientNet layer table with the squeeze-excite ratio (column 2) set to 0."""
    return [[[*block[:2], 0, *block[3:]] for block in stage] for stage in settings]


@MODELS.register_module()
class EfficientNetLite(EfficientNet):
    """EfficientNet-Lite: B-series blocks without squeeze-excite, ReLU6 (mobile/edge friendly).

    Same arguments and outputs as mmdet's ``EfficientNet``; only ``lite0`` (EfficientDet-Lite0's
    backbone; the larger Lite models keep an unscaled stem and head, which mmdet's scaling rule
    does not express).
    """

    layer_settings = {'l': _without_se(EfficientNet.layer_settings['b'])}
    # width factor, depth factor, resolution
    arch_settings = {'lite0': (1.0, 1.0, 320)}

    def __init__(self, arch: str = 'lite0', drop_path_rate: float = 0.,
                 out_indices: Sequence[int] = (6,), frozen_stages: int = 0,
                 conv_cfg: dict = dict(type='Conv2dAdaptivePadding'), norm_cfg: dict = BN_TF,
                 act_cfg: dict = dict(type='ReLU6'), norm_eval: bool = False,
                 with_cp: bool = False, init_cfg: Optional[dict] = None) -> None:
        if init_cfg is None:
            init_cfg = [dict(type='Kaiming', layer='Conv2d'),
                        dict(type='Constant', layer=['_BatchNorm', 'GroupNorm'], val=1)]
        super().__init__(arch=arch, drop_path_rate=drop_path_rate, out_indices=out_indices,
                         frozen_stages=frozen_stages, conv_cfg=conv_cfg, norm_cfg=norm_cfg,
                         act_cfg=act_cfg, norm_eval=norm_eval, with_cp=with_cp,
                         init_cfg=init_cfg)

