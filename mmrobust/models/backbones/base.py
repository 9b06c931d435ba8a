"""Behaviour shared by mmrobust's dense backbones: stage freezing, `norm_eval`, and strict
pretrained loading through the family's own checkpoint filter."""
import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model import BaseModule
from torch.nn.modules.batchnorm import _BatchNorm

from ..utils import load_pretrained


class DenseBackbone(BaseModule):
    """Base of a backbone with freezable stage groups and a strict pretrained loader.

    It resolves `arch` against the subclass's :attr:`arch_zoo` (or a custom dict with the same
    keys) and checks `out_indices` / `frozen_stages`. Subclasses provide :attr:`arch_zoo`,
    :meth:`_stage_groups` (modules per freezing group, in order),
    :meth:`_init_from_scratch`, :meth:`convert_checkpoint` (the family's checkpoint filter) and
    :meth:`_newly_added` (key prefixes a foreign checkpoint cannot hold).
    """

    arch_zoo: Dict[str, dict] = {}

    def __init__(self, arch: Union[str, dict], out_indices: Sequence[int], num_outs: int,
                 frozen_stages: int, norm_eval: bool, init_cfg: Optional[dict]) -> None:
        super().__init__(init_cfg=init_cfg)
        family, keys = type(self).__name__, sorted(next(iter(self.arch_zoo.values())))
        if isinstance(arch, str):
            if arch not in self.arch_zoo:
                raise KeyError(f'unknown {family} arch {arch!r}; choose from '
                               f'{sorted(self.arch_zoo)} or pass a dict with keys {keys}')
            self.arch_name, self.arch = arch, self.arch_zoo[arch]
        else:
            if sorted(arch) != keys:
                raise KeyError(f'a custom {family} arch needs exactly the keys {keys}, '
                               f'got {sorted(arch)}')
            self.arch_name, self.arch = 'custom', dict(arch)
        if not set(out_indices) <= set(range(num_outs)):
            raise ValueError(f'out_indices {tuple(out_indices)} must be within 0..{num_outs - 1}')
        if not -1 <= frozen_stages <= num_outs:
            raise ValueError(f'frozen_stages must be within -1..{num_outs}, not {frozen_stages}')
        self.out_indices = tuple(out_indices)
        self.frozen_stages, self.norm_eval = frozen_stages, norm_eval

    @staticmethod
    def _dense_output(x: torch.Tensor, in_h: int, in_w: int, stride: int) -> torch.Tensor:
        """A stride-`stride` map cropped to the unpadded `in_h` x `in_w` input, as contiguous NCHW.

        NOTE: the token layouts make the maps channels-last or cropped views, and mmcv 2.1's
        RoIAlign reads its input as contiguous NCHW whatever its strides: the FPN passes the
        layout on, and the RoI head of a two-stage detector then trains on scrambled features
        (a toy FAN-T Mask R-CNN stayed at box AP 0.003).
        """
        return x[..., :math.ceil(in_h / stride), :math.ceil(in_w / stride)].contiguous()

    def _stage_groups(self) -> List[List[nn.Module]]:
        raise NotImplementedError

    def _init_from_scratch(self) -> None:
        raise NotImplementedError

    def convert_checkpoint(self, checkpoint: dict) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    def _newly_added(self) -> Tuple[str, ...]:
        return ()

    def _freeze_stages(self) -> None:
        for group in self._stage_groups()[:self.frozen_stages + 1]:
            for module in group:
                module.eval()
                for param in module.parameters():
                    param.requires_grad = False

    def train(self, mode: bool = True) -> 'DenseBackbone':
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self

    def init_weights(self) -> None:
        if self.init_cfg is not None and self.init_cfg.get('type') == 'Pretrained':
            self._init_from_scratch()  # NOTE: initialises the layers the checkpoint lacks
            load_pretrained(self, self.init_cfg['checkpoint'],
                            lambda ckpt, model: model.convert_checkpoint(ckpt), self._newly_added())
        elif self.init_cfg is not None:
            super().init_weights()
        else:
            self._init_from_scratch()
        self._is_init = True
