"""Behaviour shared by mmrobust's dense backbones.

Arch tables, stage freezing, ``norm_eval``, gradient checkpointing, declared outputs
(``feature_info``) and strict pretrained loading through the family's own checkpoint filter.
"""
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from mmengine.model import BaseModule
from torch.nn.modules.batchnorm import _BatchNorm
from typing_extensions import override

from ..checkpoint import load_pretrained
from ..utils import resolve_arch


class DenseBackbone(BaseModule):
    """Base of a backbone with freezable stage groups and a strict pretrained loader.

    It resolves ``arch`` against the subclass's :attr:`arch_zoo` (or a custom dict with the same
    keys) and checks ``out_indices`` / ``frozen_stages``. Subclasses provide :attr:`arch_zoo`,
    :attr:`feature_info` (channels and stride of every output, timm's convention),
    :meth:`_stage_groups` (modules per freezing group, in order),
    :meth:`_init_from_scratch`, :meth:`convert_checkpoint` (the family's checkpoint filter) and
    :meth:`newly_added` (key prefixes a foreign checkpoint cannot hold), and run their blocks
    through :meth:`_run_block` (gradient checkpointing with ``with_cp``).
    """

    arch_zoo: Dict[str, dict] = {}
    #: per output level: ``dict(num_chs=channels, reduction=stride)``
    feature_info: List[Dict[str, int]]

    def __init__(self, arch: Union[str, dict], out_indices: Sequence[int], num_outs: int,
                 frozen_stages: int, norm_eval: bool, init_cfg: Optional[dict],
                 with_cp: bool = False) -> None:
        super().__init__(init_cfg=init_cfg)
        self.arch_name, self.arch = resolve_arch(arch, self.arch_zoo, type(self).__name__)
        if not set(out_indices) <= set(range(num_outs)):
            raise ValueError(f'out_indices {tuple(out_indices)} must be within 0..{num_outs - 1}')
        if not -1 <= frozen_stages <= num_outs:
            raise ValueError(f'frozen_stages must be within -1..{num_outs}, not {frozen_stages}')
        self.out_indices = tuple(out_indices)
        self.frozen_stages, self.norm_eval, self.with_cp = frozen_stages, norm_eval, with_cp

    def _run_block(self, block: nn.Module, *args: Any) -> Any:
        """``block(*args)``, through gradient checkpointing where it pays.

        That is when ``with_cp`` is set and a backward pass may follow (training, or an
        input-gradient attack in eval mode).
        """
        if self.with_cp and torch.is_grad_enabled():
            return cp.checkpoint(block, *args, use_reentrant=False)
        return block(*args)

    @staticmethod
    def _dense_output(x: torch.Tensor, in_h: int, in_w: int, stride: int) -> torch.Tensor:
        """A stride-``stride`` map cropped to the unpadded ``in_h`` x ``in_w`` input.

        The result is contiguous NCHW.

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

    def convert_checkpoint(self, checkpoint: dict, dropped: Optional[Dict[str, str]] = None
                           ) -> Dict[str, torch.Tensor]:
        """The family's checkpoint filter; keys it leaves out go to ``dropped`` with the reason."""
        raise NotImplementedError

    def newly_added(self) -> Tuple[str, ...]:
        """Key prefixes of layers that a foreign checkpoint cannot hold.

        A foreign checkpoint is an ImageNet classifier's, say; these layers keep their
        initialisation when one is loaded.
        """
        return ()

    def _freeze_stages(self) -> None:
        for group in self._stage_groups()[:self.frozen_stages + 1]:
            for module in group:
                module.eval()
                for param in module.parameters():
                    param.requires_grad = False

    @override
    def train(self, mode: bool = True) -> 'DenseBackbone':
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self

    @override
    def init_weights(self) -> None:
        if self.init_cfg is not None and self.init_cfg.get('type') == 'Pretrained':
            self._init_from_scratch()  # NOTE: initialises the layers the checkpoint lacks
            load_pretrained(self, self.init_cfg['checkpoint'],
                            lambda ckpt, model, dropped: model.convert_checkpoint(ckpt, dropped),
                            self.newly_added())
        elif self.init_cfg is not None:
            super().init_weights()
        else:
            self._init_from_scratch()
        self._is_init = True
