"""FAN-Swin: a Swin Transformer whose MLPs are FAN's attentional channel processing.

Paper: Zhou et al., "Understanding The Robustness in Vision Transformers", ICML 2022
(https://arxiv.org/abs/2204.12451); Swin: Liu et al., ICCV 2021 (https://arxiv.org/abs/2103.14030).
Written from the papers and mmrobust's spec; key names follow the upstream classification
checkpoints (``layers.i.blocks.j...``), loaded through :func:`checkpoint_filter_fn`.

Stages 0-2 use :class:`ChannelProcessing` (its depthwise-conv MLP without residual), stage 3 a
plain MLP. Window masks are computed for the actual (padded) input size, so any size works; the
dense backbone returns the four stage maps (strides 4-32), each through its own LayerNorm.
"""
import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks import DropPath
from typing_extensions import override

from mmrobust.registry import MODELS

from ..checkpoint import unwrap_state_dict
from ..layers import ChannelProcessing, Mlp
from ..utils import init_trunc_normal_
from .base import DenseBackbone

__all__ = ['FANSwin', 'checkpoint_filter_fn']


# -- helpers ---------------------------------------------------------------------------------------
def relative_position_index(window: int) -> torch.Tensor:
    """(window², window²) index into the (2·window-1)² relative position bias table."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window),
                                        indexing='ij')).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
    return rel[..., 0] * (2 * window - 1) + rel[..., 1]


def window_partition(x: torch.Tensor, window: int) -> torch.Tensor:
    """(B, H, W, C) -> (B * num_windows, window², C)."""
    b, h, w, c = x.shape
    x = x.reshape(b, h // window, window, w // window, window, c)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window * window, c)


def window_reverse(windows: torch.Tensor, window: int, h: int, w: int) -> torch.Tensor:
    """(B * num_windows, window², C) -> (B, H, W, C)."""
    c = windows.shape[-1]
    x = windows.reshape(-1, h // window, w // window, window, window, c)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, h, w, c)


def shifted_window_mask(h: int, w: int, window: int, shift: int,
                        device: torch.device) -> torch.Tensor:
    """Additive mask (num_windows, window², window²) that keeps cyclically shifted regions apart."""
    region = torch.zeros(1, h, w, 1, device=device)
    cuts = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
    for i, hs in enumerate(cuts):
        for j, ws in enumerate(cuts):
            region[:, hs, ws, :] = i * 3 + j
    ids = window_partition(region, window).squeeze(-1)
    diff = ids[:, None, :] - ids[:, :, None]
    return torch.zeros_like(diff).masked_fill(diff != 0, float('-inf'))


# -- blocks ----------------------------------------------------------------------------------------
class WindowAttention(nn.Module):
    """Multi-head attention inside windows with a learned relative position bias."""

    def __init__(self, dim: int, num_heads: int, window: int) -> None:
        super().__init__()
        self.num_heads, self.window = num_heads, window
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window - 1) ** 2, num_heads))
        self.register_buffer('relative_position_index', relative_position_index(window),
                             persistent=False)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        bw, n, c = x.shape
        q, k, v = self.qkv(x).reshape(bw, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        bias = self.relative_position_bias_table[self.relative_position_index.reshape(-1)]
        bias = bias.reshape(n, n, -1).permute(2, 0, 1).unsqueeze(0)  # (1, heads, N, N)
        if mask is not None:
            nw = mask.shape[0]
            bias = (bias.unsqueeze(0) + mask[None, :, None]).reshape(
                1, nw, self.num_heads, n, n).expand(bw // nw, -1, -1, -1, -1).reshape(
                bw, self.num_heads, n, n)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
        return self.proj(x.transpose(1, 2).reshape(bw, n, c))


class FANSwinBlock(nn.Module):
    """(Shifted) window attention + channel processing (or a plain MLP), pre-norm residual."""

    def __init__(self, dim: int, num_heads: int, window: int, shift: bool,
                 channel_processing: bool, mlp_ratio: float = 4., drop_path: float = 0.) -> None:
        super().__init__()
        self.window, self.shift = window, shift
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, num_heads, window)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = (ChannelProcessing(dim, num_heads, mlp_ratio, dw_residual=False)
                    if channel_processing else Mlp(dim, int(dim * mlp_ratio)))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, c = x.shape
        y = self.norm1(x).reshape(b, h, w, c)
        ws = self.window
        y = F.pad(y, (0, 0, 0, (-w) % ws, 0, (-h) % ws))
        hp, wp = y.shape[1:3]
        # NOTE: a map that fits in one window gains nothing from shifting
        shift = ws // 2 if self.shift and (h > ws or w > ws) else 0
        mask = None
        if shift:
            y = torch.roll(y, (-shift, -shift), dims=(1, 2))
            mask = shifted_window_mask(hp, wp, ws, shift, y.device)
        y = window_reverse(self.attn(window_partition(y, ws), mask), ws, hp, wp)
        if shift:
            y = torch.roll(y, (shift, shift), dims=(1, 2))
        x = x + self.drop_path(y[:, :h, :w].reshape(b, n, c))
        z = self.norm2(x)
        z = self.mlp(z, h, w) if isinstance(self.mlp, ChannelProcessing) else self.mlp(z)
        return x + self.drop_path(z)


class PatchMerging(nn.Module):
    """2x2 neighbourhood concat -> LayerNorm -> linear 4C -> 2C (stride x2)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor, h: int, w: int) -> Tuple[torch.Tensor, int, int]:
        b, _, c = x.shape
        x = F.pad(x.reshape(b, h, w, c), (0, 0, 0, w % 2, 0, h % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]],
                      dim=-1)
        h, w = x.shape[1:3]
        return self.reduction(self.norm(x.reshape(b, h * w, 4 * c))), h, w


class FANSwinStage(nn.Module):
    def __init__(self, dim: int, depth: int, num_heads: int, window: int,
                 channel_processing: bool, drop_paths: Sequence[float], downsample: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([
            FANSwinBlock(dim, num_heads, window, shift=i % 2 == 1,
                         channel_processing=channel_processing, drop_path=drop_paths[i])
            for i in range(depth)])
        self.downsample = PatchMerging(dim) if downsample else None


class PatchEmbed(nn.Module):
    def __init__(self, embed_dims: int, patch: int = 4) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, embed_dims, patch, stride=patch)
        self.norm = nn.LayerNorm(embed_dims)


# -- model -----------------------------------------------------------------------------------------
@MODELS.register_module()
class FANSwin(DenseBackbone):
    """FAN-Swin backbone.

    Args:
        arch: A name of :attr:`arch_zoo` or a dict with its keys.
        out_type: ``'dense'`` (4 stage maps with their own norms) or ``'cls'`` (ImageNet logits).
        out_indices: Which stage maps to return.
        num_classes: Classes of the ``'cls'`` head.
        window_size: Attention window.
        drop_path_rate: Stochastic depth, ramped linearly over all blocks (as upstream).
        frozen_stages: -1 nothing; 0 the patch embedding; k >= 1 also stages 0..k-1.
        norm_eval: Keep BatchNorm layers in eval mode while training.
        with_cp: Gradient checkpointing of every block.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH)`` loads strictly through
            :func:`checkpoint_filter_fn`.
    """
    # embed_dims, depth per stage, heads per stage
    arch_zoo: Dict[str, dict] = {
        'tiny': dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
        'small': dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
        'base': dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
        'large': dict(embed_dims=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48)),
    }

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 out_type: str = 'dense',
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 num_classes: int = 1000,
                 window_size: int = 7,
                 drop_path_rate: float = 0.,
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(arch, out_indices, 4, frozen_stages, norm_eval, init_cfg, with_cp)
        arch = self.arch
        if out_type not in ('dense', 'cls'):
            raise ValueError(f"out_type must be 'dense' or 'cls', not {out_type!r}")
        depths, heads = arch['depths'], arch['num_heads']
        if len(depths) != 4 or len(heads) != 4:
            raise ValueError('FAN-Swin has 4 stages: depths and num_heads need 4 entries')
        dims = [arch['embed_dims'] * 2 ** i for i in range(4)]
        self.out_type = out_type

        self.patch_embed = PatchEmbed(dims[0])
        n = sum(depths)
        dpr = [drop_path_rate * i / max(n - 1, 1) for i in range(n)]
        self.layers = nn.ModuleList()
        for i in range(4):
            start = sum(depths[:i])
            self.layers.append(FANSwinStage(
                dims[i], depths[i], heads[i], window_size, channel_processing=i < 3,
                drop_paths=dpr[start:start + depths[i]], downsample=i < 3))
        if out_type == 'cls':
            self.norm = nn.LayerNorm(dims[3])
            self.head = nn.Linear(dims[3], num_classes)
        else:
            for i in self.out_indices:
                self.add_module(f'norm{i}', nn.LayerNorm(dims[i]))
        self.feature_info = [dict(num_chs=dims[i], reduction=4 * 2 ** i) for i in range(4)]
        self._freeze_stages()

    # -- weights -----------------------------------------------------------------------------------
    def _stage_groups(self) -> List[List[nn.Module]]:
        """Patch embedding, then each stage with its output norm."""
        groups: List[List[nn.Module]] = [[self.patch_embed]]
        for i, layer in enumerate(self.layers):
            norm = [getattr(self, f'norm{i}')] if hasattr(self, f'norm{i}') else []
            groups.append([layer] + norm)
        return groups

    @override
    def newly_added(self) -> Tuple[str, ...]:
        # NOTE: the per-output norms are not in classification checkpoints
        return tuple(f'norm{i}.' for i in self.out_indices) if self.out_type == 'dense' else ()

    @override
    def convert_checkpoint(self, checkpoint: dict, dropped: Optional[Dict[str, str]] = None
                           ) -> Dict[str, torch.Tensor]:
        return checkpoint_filter_fn(checkpoint, self, dropped)

    def _init_from_scratch(self) -> None:
        init_trunc_normal_(self, extra={WindowAttention: ('relative_position_bias_table', )})

    # -- forward -----------------------------------------------------------------------------------
    @override
    def forward(self, x: torch.Tensor) -> Union[Tuple[torch.Tensor, ...], torch.Tensor]:
        h, w = x.shape[-2:]
        x = F.pad(x, (0, (-w) % 4, 0, (-h) % 4))
        x = self.patch_embed.proj(x)
        hs, ws = x.shape[-2:]
        x = self.patch_embed.norm(x.flatten(2).transpose(1, 2))
        outs = []
        for i, layer in enumerate(self.layers):
            for blk in layer.blocks:
                x = self._run_block(blk, x, hs, ws)
            if i in self.out_indices and self.out_type == 'dense':
                out = getattr(self, f'norm{i}')(x)
                out = out.transpose(1, 2).reshape(x.shape[0], -1, hs, ws)
                outs.append(self._dense_output(out, h, w, 4 * 2 ** i))
            if layer.downsample is not None:
                x, hs, ws = layer.downsample(x, hs, ws)
        if self.out_type == 'cls':
            return self.head(self.norm(x).mean(dim=1))
        return tuple(outs)


# -- checkpoints -----------------------------------------------------------------------------------
_CLS_ONLY = ('head.', 'norm.')
_BUFFERS = ('attn_mask', 'relative_position_index')


def _resample_bias_table(table: torch.Tensor, size: int) -> torch.Tensor:
    """Bicubic resampling of a ((2w-1)², heads) relative position bias table."""
    old = int(math.isqrt(table.shape[0]))
    grid = table.T.reshape(1, -1, old, old)
    grid = F.interpolate(grid, size=(size, size), mode='bicubic', align_corners=False)
    return grid.reshape(-1, size * size).T.contiguous()


def checkpoint_filter_fn(checkpoint: dict, model: FANSwin,
                         dropped: Optional[Dict[str, str]] = None) -> Dict[str, torch.Tensor]:
    """Convert an upstream FAN-Swin checkpoint for ``model``.

    Unwraps ``state_dict`` / ``model`` / ``state_dict_ema``, strips ``module.`` / ``backbone.``,
    drops the shift masks and relative position indices (recomputed for the actual input), drops
    ``head.*`` / ``norm.*`` for the dense backbone, and resamples relative position bias tables
    trained with another window size. Dropped keys go to ``dropped`` (key -> reason) when given.
    """
    dropped = {} if dropped is None else dropped
    state = unwrap_state_dict(checkpoint, strip_prefixes=('module.', 'backbone.'))
    own = model.state_dict()
    out = {}
    for k, v in state.items():
        if k.rsplit('.', 1)[-1] in _BUFFERS:
            dropped[k] = 'shift mask / position index, recomputed for the actual input'
            continue
        if model.out_type != 'cls' and k.startswith(_CLS_ONLY):
            dropped[k] = 'ImageNet classifier head / final norm (a dense backbone has none)'
            continue
        if k.endswith('relative_position_bias_table') and k in own and v.shape != own[k].shape:
            v = _resample_bias_table(v, int(math.isqrt(own[k].shape[0])))
        out[k] = v
    return out
