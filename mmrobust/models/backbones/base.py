"""Behaviour shared by mmrobust's dense backbones: stage freezing, `norm_eval`, and strict
pretrained loading through the family's own checkpoint filter."""
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.model import BaseModule
from torch.nn.modules.batchnorm import _BatchNorm

from ..utils import load_pretrained


class DenseBackbone(BaseModule):
    """Base of a backbone with freezable stage groups and a strict pretrained loader.

    Subclasses provide :meth:`_stage_groups` (modules per freezing group, in order),
    :meth:`_init_from_scratch`, :meth:`convert_checkpoint` (the family's checkpoint filter) and
    :meth:`_newly_added` (key prefixes a foreign checkpoint cannot hold).
    """

    def __init__(self, frozen_stages: int, norm_eval: bool, init_cfg: Optional[dict]) -> None:
        super().__init__(init_cfg=init_cfg)
        self.frozen_stages, self.norm_eval = frozen_stages, norm_eval

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
