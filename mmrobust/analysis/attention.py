"""Attention rollout for FAN-Hybrid and Dr-ViT, and FAN's channel-attention gates.

Abnar & Zuidema, "Quantifying Attention Flow in Transformers" (ACL 2020): with A_l the
head-averaged attention of block l, rollout = prod_l (0.5 A_l + 0.5 I) (rows renormalised), the
share of each input token in each output token. The attention is recomputed from each block's
input with its own projections (the models use fused SDPA, which does not return weights).
For Dr-ViT the map is the class token's row; FAN's dense models have no class token, so the map
is the mean over all query tokens (how much each token feeds the output).
"""
import math
import os
import os.path as osp
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import cv2
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..models.backbones.drvit import Attention as ViTAttention
from ..models.backbones.drvit import DrViT
from ..models.backbones.fan import FANBlock, FANHybrid, TokenMixing
from ..models.layers import ChannelProcessing
from ..utils.io import atomic_image, atomic_json, save_figure

__all__ = ['attention_probs', 'rollout', 'AttentionRecorder', 'attention_report', 'overlay']


def attention_probs(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Softmax attention of a FAN ``TokenMixing`` or a Dr-ViT ``Attention``.

    Softmax attention (B, heads, N, N) of a FAN ``TokenMixing`` or a Dr-ViT ``Attention`` for its
    input tokens ``x`` (B, N, C).
    """
    b, n, c = x.shape
    heads = module.num_heads
    if isinstance(module, TokenMixing):
        q = module.q(x)
        k = module.kv(x)[..., :c]
    elif isinstance(module, ViTAttention):
        q, k = module.qkv(x)[..., :c], module.qkv(x)[..., c:2 * c]
    else:
        raise TypeError(f'no attention rule for {type(module).__name__}')
    q = q.reshape(b, n, heads, -1).transpose(1, 2)
    k = k.reshape(b, n, heads, -1).transpose(1, 2)
    return (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(-1)


def rollout(attentions: List[torch.Tensor], residual: float = 0.5) -> torch.Tensor:
    """(B, N, N) rollout of per-block attentions (B, heads, N, N); every row sums to 1."""
    if not attentions:
        raise ValueError('no attention maps were recorded')
    result = None
    for attn in attentions:
        a = attn.float().mean(1)
        eye = torch.eye(a.shape[-1], device=a.device).expand_as(a)
        a = residual * eye + (1 - residual) * a
        a = a / a.sum(-1, keepdim=True)
        result = a if result is None else a @ result
    return result


class AttentionRecorder:
    """Records the attention of every FAN / Dr-ViT block during a forward pass.

    FAN's channel gates too; of a backbone, or of a detector / segmentor holding one.
    """

    def __init__(self, model: nn.Module) -> None:
        self.backbone = next((m for m in model.modules() if isinstance(m, (FANHybrid, DrViT))),
                             None)
        if self.backbone is None:
            raise TypeError(f'{type(model).__name__} has no FAN-Hybrid or Dr-ViT backbone; '
                            'attention rollout needs one')
        self.attentions: List[torch.Tensor] = []
        self.gates: List[torch.Tensor] = []
        self.grid: Optional[Tuple[int, int]] = None

    @contextmanager
    def record(self) -> Iterator['AttentionRecorder']:
        """Hooks the blocks for the duration of the ``with`` block (the lists start empty)."""
        self.attentions, self.gates, self.grid = [], [], None
        handles = []
        for m in self.backbone.modules():
            if isinstance(m, (TokenMixing, ViTAttention)):  # not FAN's ClassAttention
                handles.append(m.register_forward_pre_hook(
                    lambda mod, args: self.attentions.append(attention_probs(mod, args[0]))))
            elif isinstance(m, ChannelProcessing):
                handles.append(m.register_forward_pre_hook(
                    lambda mod, args: self.gates.append(mod.channel_gates(args[0]))))
            elif isinstance(m, FANBlock):
                handles.append(m.register_forward_pre_hook(self._grid_from_args))
        if isinstance(self.backbone, DrViT):
            handles.append(self.backbone.register_forward_pre_hook(self._vit_grid))
        try:
            with torch.no_grad():
                yield self
        finally:
            for h in handles:
                h.remove()

    def _grid_from_args(self, module: nn.Module, args) -> None:
        self.grid = (int(args[1]), int(args[2]))

    def _vit_grid(self, module: nn.Module, args) -> None:
        h, w = args[0].shape[-2:]
        multiple = module.patch_size * 2
        self.grid = (-(-h // multiple) * 2, -(-w // multiple) * 2)

    def maps(self) -> torch.Tensor:
        """(B, h, w) rollout maps on the token grid, each normalised to sum to 1."""
        roll = rollout(self.attentions)
        if isinstance(self.backbone, DrViT):
            per_token = roll[:, 0, 1:]  # the class token's row, over the patch tokens
        else:
            per_token = roll.mean(1)
        h, w = self.grid
        per_token = per_token / per_token.sum(-1, keepdim=True)
        return per_token.reshape(-1, h, w)

    def gate_matrix(self) -> torch.Tensor:
        """(B, blocks, channels) FAN channel-attention gates (empty for Dr-ViT)."""
        if not self.gates:
            return torch.empty(0)
        return torch.stack([g.flatten(1) for g in self.gates], 1)


# -- a report over images --------------------------------------------------------------------------

def overlay(rgb: np.ndarray, heat: np.ndarray) -> np.ndarray:
    """``heat`` (H, W) as a jet colour map blended over ``rgb``; returns BGR."""
    heat = (255 * heat / max(heat.max(), 1e-12)).astype(np.uint8)
    color = cv2.applyColorMap(heat, cv2.COLORMAP_JET)
    return cv2.addWeighted(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), 0.5, color, 0.5, 0)


def attention_report(model: nn.Module, paths: Sequence[str], corruptions: Sequence[str],
                     severity: int, out_dir: str, seed: int = 0, max_size: int = 512) -> Dict:
    """Rollout maps and channel gates of ``model`` on clean and corrupted images.

    Writes per image ``<name>.png`` (inputs above their rollout overlays) and, for FAN,
    ``gates_<name>.png``; ``attention.json`` holds per image and corruption the L1 distance of
    the rollout map to the clean one and the gate statistics. Returns that JSON's content.
    """
    from ..corruptions import corrupt, derive_seed
    from .token_view import read_rgb
    recorder = AttentionRecorder(model)
    os.makedirs(out_dir, exist_ok=True)
    report = {}
    for path in paths:
        name = osp.splitext(osp.basename(path))[0]
        img = read_rgb(path, max_size)
        variants = {'clean': img}
        for c in corruptions:
            variants[c] = corrupt(img, c, severity,
                                  seed=derive_seed(seed, path, c, severity))
        maps, gates = {}, {}
        for label, rgb in variants.items():
            # NOTE: as loaded by the pipelines (BGR); the preprocessor flips it if it should
            inputs = torch.from_numpy(np.ascontiguousarray(rgb[..., ::-1])).permute(2, 0, 1)
            data = model.data_preprocessor(dict(inputs=[inputs]), False)
            with recorder.record():
                model.backbone(data['inputs'])
            grid = recorder.maps()[0]
            up = F.interpolate(grid[None, None], scale_factor=16, mode='bilinear')[0, 0]
            maps[label] = up[:img.shape[0], :img.shape[1]].numpy()
            gates[label] = recorder.gate_matrix()
        top = np.concatenate([cv2.cvtColor(v, cv2.COLOR_RGB2BGR) for v in variants.values()], 1)
        bottom = np.concatenate([overlay(variants[k], m) for k, m in maps.items()], 1)
        atomic_image(osp.join(out_dir, f'{name}.png'), np.concatenate([top, bottom], 0))
        clean = maps['clean'] / maps['clean'].sum()
        entry = {k: dict(rollout_l1_to_clean=float(np.abs(m / m.sum() - clean).sum()))
                 for k, m in maps.items()}
        if gates['clean'].numel():
            import matplotlib
            matplotlib.use('Agg')
            import matplotlib.pyplot as plt
            fig, axes = plt.subplots(1, len(gates), figsize=(3 * len(gates), 3), squeeze=False)
            for ax, (k, g) in zip(axes[0], gates.items()):
                ax.imshow(g[0].numpy(), aspect='auto', cmap='viridis')
                ax.set_title(k, fontsize=8)
                ax.set_xlabel('channel')
                ax.set_ylabel('FAN block')
                entry[k]['gate_mean'] = float(g.mean())
                entry[k]['gate_l1_to_clean'] = float((g - gates['clean']).abs().mean())
            save_figure(fig, osp.join(out_dir, f'gates_{name}.png'), dpi=100)
        report[path] = entry
        print(name, ', '.join(f'{k}: rollout L1 {v["rollout_l1_to_clean"]:.3f}'
                              for k, v in entry.items() if k != 'clean'))
    result = dict(severity=severity, images=report)
    atomic_json(osp.join(out_dir, 'attention.json'), result)
    return result
