"""EfficientDet's class and box nets.

Tan et al., "EfficientDet: Scalable and Efficient Object Detection", CVPR 2020
(https://arxiv.org/abs/1911.09070). D0 (B0 backbone, 64 channels, 3 BiFPN layers, 3 head
layers, 90 classes) has 3.88M parameters, the paper's 3.9M.
"""
import math
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
from mmcv.cnn import build_activation_layer, build_norm_layer
from mmdet.models.dense_heads import AnchorHead
from typing_extensions import override

from ...registry import MODELS
from ..layers.separable_conv import BN_TF, SeparableConv

__all__ = ['EfficientDetHead']


@MODELS.register_module()
class EfficientDetHead(AnchorHead):
    """EfficientDet's class and box nets.

    Separable convs shared across levels, one BN per level and layer, a separable-conv predictor
    (focal loss, 9 anchors per position).

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

    @override
    def init_weights(self) -> None:
        super().init_weights()
        nn.init.constant_(self.cls_pred.pointwise.bias,
                          -math.log((1 - self.prior_prob) / self.prior_prob))

    def _run(self, x: torch.Tensor, level: int, convs: nn.ModuleList, norms: nn.ModuleList,
             pred: nn.Module) -> torch.Tensor:
        for conv, norm in zip(convs, norms[level]):
            x = self.act(norm(conv(x)))
        return pred(x)

    @override
    def forward(self, x: Tuple[torch.Tensor, ...]) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        if len(x) != self.num_levels:
            raise ValueError(f'EfficientDetHead expects {self.num_levels} levels, got {len(x)}')
        cls_scores = [self._run(f, i, self.cls_convs, self.cls_norms, self.cls_pred)
                      for i, f in enumerate(x)]
        bbox_preds = [self._run(f, i, self.reg_convs, self.reg_norms, self.reg_pred)
                      for i, f in enumerate(x)]
        return cls_scores, bbox_preds
