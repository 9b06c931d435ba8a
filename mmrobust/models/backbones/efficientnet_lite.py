"""EfficientNet-Lite, the backbone of EfficientDet-Lite: B-series blocks without
squeeze-excite, ReLU6 (mobile / edge friendly), on mmdet's ``EfficientNet``."""
from typing import Optional, Sequence

from mmdet.models.backbones import EfficientNet

from ...registry import MODELS
from ..layers.separable_conv import BN_TF

__all__ = ['EfficientNetLite']


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
