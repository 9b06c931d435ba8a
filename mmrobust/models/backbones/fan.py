"""FAN-Hybrid: Fully Attentional Networks with a ConvNeXt stem, for detection and segmentation.

Paper: Zhou et al., "Understanding The Robustness in Vision Transformers", ICML 2022
(https://arxiv.org/abs/2204.12451). Written from the paper and mmrobust's spec; it loads the
released ImageNet checkpoints (``fan_hybrid_*.pth.tar``) through :func:`checkpoint_filter_fn`.

Dense outputs (upstream's): ConvNeXt stage 0 (stride 4) and 1 (stride 8), the output of FAN block
``out_block`` (stride 16), and the patch tokens after the class-attention blocks, either at stride
16 (``out_type='seg'``) or through a learnable 3x3 stride-2 conv at stride 32 (``out_type='det'``).
``out_type='cls'`` is the ImageNet classifier (cls token -> norm -> head).
"""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks import DropPath
from typing_extensions import override

from mmrobust.registry import MODELS

from ..checkpoint import unwrap_state_dict
from ..layers import ChannelProcessing, ConvMlp, LayerNorm2d, Mlp, PositionalEncodingFourier
from ..utils import init_trunc_normal_
from .base import DenseBackbone

__all__ = ['FANHybrid', 'checkpoint_filter_fn']


# -- ConvNeXt stem ---------------------------------------------------------------------------------
class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7 conv -> LayerNorm -> 1x1 MLP -> layer scale, residual."""

    def __init__(self, dim: int, ls_init: float = 1e-6, unbiased_norm: bool = True) -> None:
        super().__init__()
        self.conv_dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = LayerNorm2d(dim, eps=1e-6, unbiased=unbiased_norm)
        self.mlp = ConvMlp(dim, 4 * dim)
        self.gamma = nn.Parameter(torch.full((dim,), ls_init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.mlp(self.norm(self.conv_dw(x)))
        return x + y * self.gamma.reshape(1, -1, 1, 1)


class ConvNeXtStage(nn.Module):
    def __init__(self, in_chs: int, out_chs: int, depth: int, downsample: bool,
                 unbiased_norm: bool = True) -> None:
        super().__init__()
        self.downsample = nn.Sequential(LayerNorm2d(in_chs, eps=1e-6, unbiased=unbiased_norm),
                                        nn.Conv2d(in_chs, out_chs, 2, stride=2)) \
            if downsample else nn.Identity()
        self.blocks = nn.Sequential(*[ConvNeXtBlock(out_chs, unbiased_norm=unbiased_norm)
                                      for _ in range(depth)])


class ConvNeXtStem(nn.Module):
    """4x4 patchify + two ConvNeXt stages (strides 4 and 8).

    NOTE: all norms after the first use the unbiased variance by default, which is what the
    released weights were trained with (see :class:`LayerNorm2d`).
    """

    def __init__(self, depths: Sequence[int], dims: Sequence[int] = (128, 256),
                 unbiased_norm: bool = True) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, stride=4),
                                  LayerNorm2d(dims[0], eps=1e-6))
        self.stages = nn.ModuleList([
            ConvNeXtStage(dims[max(i - 1, 0)], dims[i], depths[i], downsample=i > 0,
                          unbiased_norm=unbiased_norm)
            for i in range(len(depths))])


class HybridEmbed(nn.Module):
    """ConvNeXt stem followed by a 2x2 stride-2 projection to tokens at stride 16."""

    def __init__(self, embed_dims: int, depths: Sequence[int],
                 dims: Sequence[int] = (128, 256), unbiased_norm: bool = True) -> None:
        super().__init__()
        self.backbone = ConvNeXtStem(depths, dims, unbiased_norm)
        self.proj = nn.Conv2d(dims[-1], embed_dims, 2, stride=2)


# -- FAN blocks ------------------------------------------------------------------------------------
class TokenMixing(nn.Module):
    """Multi-head self-attention with separate q and kv projections."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q = self.q(x).reshape(b, n, self.num_heads, -1).transpose(1, 2)
        k, v = self.kv(x).reshape(b, n, 2, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class FANBlock(nn.Module):
    """Token mixing and attentional channel processing, each layer-scaled and residual."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4., drop_path: float = 0.,
                 eta: float = 1.) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = TokenMixing(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = ChannelProcessing(dim, num_heads, mlp_ratio)
        self.gamma1 = nn.Parameter(torch.full((dim,), eta))
        self.gamma2 = nn.Parameter(torch.full((dim,), eta))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = x + self.drop_path(self.gamma1 * self.attn(self.norm1(x)))
        return x + self.drop_path(self.gamma2 * self.mlp(self.norm2(x), h, w))


class ClassAttention(nn.Module):
    """Attention with the query of the class token only (XCiT/CaiT)."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q = self.q(x[:, :1]).reshape(b, 1, self.num_heads, -1).transpose(1, 2)
        k = self.k(x).reshape(b, n, self.num_heads, -1).transpose(1, 2)
        v = self.v(x).reshape(b, n, self.num_heads, -1).transpose(1, 2)
        cls = F.scaled_dot_product_attention(q, k, v)
        return self.proj(cls.transpose(1, 2).reshape(b, 1, c))


class ClassAttentionBlock(nn.Module):
    """XCiT class-attention block: the class token attends to all tokens.

    Patch tokens pass through their normalised values.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4., eta: float = 1.) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = ClassAttention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.gamma1 = nn.Parameter(torch.full((dim,), eta))
        self.gamma2 = nn.Parameter(torch.full((dim,), eta))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.norm1(x)
        x = x + self.gamma1 * torch.cat((self.attn(u), u[:, 1:]), dim=1)
        z = self.norm2(x)
        # NOTE: the residual is z itself, so patch tokens leave as 2 * z (as upstream)
        cls = z[:, :1] + self.gamma2 * self.mlp(z[:, :1])
        return torch.cat((cls, 2 * z[:, 1:]), dim=1)

    def forward_patch_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """What :meth:`forward` does to the patch tokens, without the class token.

        Patch tokens never read the class token (every operation on them is per token), so
        dense models skip the class path entirely.
        """
        x = x + self.gamma1 * self.norm1(x)
        return 2 * self.norm2(x)

    def class_path_parameters(self) -> List[nn.Parameter]:
        """Parameters that only the class token uses."""
        return [*self.attn.parameters(), *self.mlp.parameters(), self.gamma2]


# -- model -----------------------------------------------------------------------------------------
@MODELS.register_module()
class FANHybrid(DenseBackbone):
    """FAN-Hybrid backbone (ConvNeXt stem + FAN blocks + class attention).

    Args:
        arch: A name of :attr:`arch_zoo` or a dict with its keys.
        out_type: ``'det'`` (4th map at stride 32 through ``learnable_downsample``), ``'seg'`` (4th
            map at stride 16) or ``'cls'`` (ImageNet logits; for checks and fine-tuning).
        out_indices: Which of the 4 dense maps to return.
        num_classes: Classes of the ``'cls'`` head.
        drop_path_rate: Stochastic depth of the FAN blocks.
        drop_path_schedule: ``'constant'`` (every block ``drop_path_rate``, as upstream) or
            ``'linear'`` (ramped from 0 to ``drop_path_rate``).
        pos_embed_legacy: Use upstream's dense-prediction Fourier formula (see
            :func:`mmrobust.models.layers.fourier_features`).
        stem_unbiased_norm: Normalise the ConvNeXt stem's inner LayerNorms by the unbiased
            variance, as the released weights were trained (see :class:`LayerNorm2d`).
        frozen_stages: Freeze parameters up to this output stage: 0 the stem conv, 1-4 also the
            modules that produce outputs 0..k-1 (4 = everything); -1 freezes nothing.
        norm_eval: Keep BatchNorm layers in eval mode while training.
        with_cp: Gradient checkpointing of every block (saves memory, same outputs).
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH)`` loads an upstream or mmrobust
            checkpoint strictly through :func:`checkpoint_filter_fn`.
    """
    # embed_dims, FAN blocks, heads, ConvNeXt depths, FAN block of the stride-16 output
    arch_zoo: Dict[str, dict] = {
        'tiny': dict(embed_dims=192, depth=8, num_heads=8, convnext_depths=(3, 3), out_block=7),
        'small': dict(embed_dims=384, depth=10, num_heads=8, convnext_depths=(3, 3), out_block=9),
        'base': dict(embed_dims=448, depth=16, num_heads=8, convnext_depths=(3, 3),
                     out_block=15),
        'large': dict(embed_dims=480, depth=22, num_heads=10, convnext_depths=(3, 5),
                      out_block=18),
    }
    stem_dims = (128, 256)
    det_out_dims = 768
    num_cls_attn_blocks = 2
    mlp_ratio = 4.

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 out_type: str = 'det',
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 num_classes: int = 1000,
                 drop_path_rate: float = 0.,
                 drop_path_schedule: str = 'constant',
                 pos_embed_legacy: bool = False,
                 stem_unbiased_norm: bool = True,
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(arch, out_indices, 4, frozen_stages, norm_eval, init_cfg, with_cp)
        arch = self.arch
        if out_type not in ('det', 'seg', 'cls'):
            raise ValueError(f"out_type must be 'det', 'seg' or 'cls', not {out_type!r}")
        if drop_path_schedule not in ('constant', 'linear'):
            raise ValueError("drop_path_schedule must be 'constant' or 'linear'")
        if not 0 <= arch['out_block'] < arch['depth']:
            raise ValueError(f"out_block {arch['out_block']} is not a block index "
                             f"(< {arch['depth']})")
        dim, heads, depth = arch['embed_dims'], arch['num_heads'], arch['depth']
        self.embed_dims, self.out_block = dim, arch['out_block']
        self.out_type = out_type

        self.patch_embed = HybridEmbed(dim, arch['convnext_depths'], self.stem_dims,
                                       stem_unbiased_norm)
        self.pos_embed = PositionalEncodingFourier(dim, legacy=pos_embed_legacy)
        dpr = ([drop_path_rate] * depth if drop_path_schedule == 'constant' else
               [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)])
        self.blocks = nn.ModuleList(
            [FANBlock(dim, heads, self.mlp_ratio, drop_path=dpr[i]) for i in range(depth)])
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.cls_attn_blocks = nn.ModuleList([
            ClassAttentionBlock(dim, heads, self.mlp_ratio)
            for _ in range(self.num_cls_attn_blocks)])
        if out_type == 'det':
            self.learnable_downsample = nn.Conv2d(dim, self.det_out_dims, 3, stride=2, padding=1)
        elif out_type == 'cls':
            self.norm = nn.LayerNorm(dim, eps=1e-6)
            self.head = nn.Linear(dim, num_classes)
        if out_type != 'cls':
            # NOTE: kept for strict loading of the released checkpoints, but the dense outputs
            # do not depend on them; frozen, so optimizers and DDP ignore them
            for param in self._class_path_parameters():
                param.requires_grad = False
        last = self.det_out_dims if out_type == 'det' else dim
        self.feature_info = [
            dict(num_chs=c, reduction=r) for c, r in zip(
                (*self.stem_dims, dim, last), (4, 8, 16, 32 if out_type == 'det' else 16))]
        self._freeze_stages()

    # -- weights -----------------------------------------------------------------------------------
    def _class_path_parameters(self) -> List[nn.Parameter]:
        return [self.cls_token, *(p for blk in self.cls_attn_blocks
                                  for p in blk.class_path_parameters())]

    def _stage_groups(self) -> List[List[nn.Module]]:
        """Stem conv, ConvNeXt stage 0, stage 1, FAN blocks up to the stride-16 output, rest."""
        convnext = self.patch_embed.backbone
        rest: List[nn.Module] = [*self.blocks[self.out_block + 1:], *self.cls_attn_blocks]
        rest += [getattr(self, n) for n in ('learnable_downsample', 'norm', 'head')
                 if hasattr(self, n)]
        return [[convnext.stem], [convnext.stages[0]], [convnext.stages[1]],
                [self.patch_embed.proj, self.pos_embed, *self.blocks[:self.out_block + 1]], rest]

    def _freeze_stages(self) -> None:
        super()._freeze_stages()
        if self.frozen_stages >= 4:
            self.cls_token.requires_grad = False

    @override
    def newly_added(self) -> Tuple[str, ...]:
        return ('learnable_downsample.',) if self.out_type == 'det' else ()

    @override
    def convert_checkpoint(self, checkpoint: dict, dropped: Optional[Dict[str, str]] = None
                           ) -> Dict[str, torch.Tensor]:
        return checkpoint_filter_fn(checkpoint, self, dropped)

    def _init_from_scratch(self) -> None:
        nn.init.trunc_normal_(self.cls_token, std=.02)
        init_trunc_normal_(self, layers=(nn.Linear, nn.Conv2d))
        # NOTE: padded pixels (zeros after the data preprocessor's normalisation) reach the stem
        # LayerNorm as the conv bias alone. A zero bias makes that a zero vector, whose
        # LayerNorm gradient is scaled by 1/sqrt(eps) = 1000: a detector trained from scratch
        # then sees backbone gradient norms of ~1e4 and gradient clipping shrinks every other
        # layer's update with them. A small random bias gives padding a well-conditioned
        # embedding of its own.
        nn.init.trunc_normal_(self.patch_embed.backbone.stem[0].bias, std=.02)

    # -- forward -----------------------------------------------------------------------------------
    @override
    def forward(self, x: torch.Tensor) -> Union[Tuple[torch.Tensor, ...], torch.Tensor]:
        h, w = x.shape[-2:]
        # NOTE: any input size: pad to the token stride, crop the maps back afterwards
        x = F.pad(x, (0, (-w) % 16, 0, (-h) % 16))
        convnext = self.patch_embed.backbone
        x = convnext.stem(x)
        maps = []
        for stage in convnext.stages:
            x = stage.downsample(x)
            for blk in stage.blocks:
                x = self._run_block(blk, x)
            maps.append(x)
        x = self.patch_embed.proj(x)
        b, c, hp, wp = x.shape
        x = (x + self.pos_embed(hp, wp)).flatten(2).transpose(1, 2)
        for i, blk in enumerate(self.blocks):
            x = self._run_block(blk, x, hp, wp)
            if i == self.out_block:
                maps.append(x.transpose(1, 2).reshape(b, c, hp, wp))
        if self.out_type == 'cls':
            x = torch.cat((self.cls_token.expand(b, -1, -1), x), dim=1)
            for blk in self.cls_attn_blocks:
                x = self._run_block(blk, x)
            return self.head(self.norm(x)[:, 0])
        for blk in self.cls_attn_blocks:
            x = blk.forward_patch_tokens(x)
        last = x.transpose(1, 2).reshape(b, c, hp, wp)
        if self.out_type == 'det':
            last = self.learnable_downsample(last)
        maps.append(last)
        return tuple(self._dense_output(m, h, w, info['reduction'])
                     for i, (m, info) in enumerate(zip(maps, self.feature_info))
                     if i in self.out_indices)


# -- checkpoints -----------------------------------------------------------------------------------
_CLS_ONLY = ('head.', 'norm.')


def checkpoint_filter_fn(checkpoint: dict, model: FANHybrid,
                         dropped: Optional[Dict[str, str]] = None) -> Dict[str, torch.Tensor]:
    """Convert an upstream FAN-Hybrid checkpoint (classification or dense) for ``model``.

    Handles ``state_dict`` / ``model`` / ``state_dict_ema`` wrappers, DDP ``module.`` and detector
    ``backbone.`` prefixes, and drops the classification-only ``head.*`` / ``norm.*`` for dense
    models. Upstream's keys equal mmrobust's otherwise; the Fourier position encoding has no table,
    so a checkpoint trained at another resolution (e.g. in22k 384) loads unchanged. Dropped keys go
    to ``dropped`` (key -> reason) when it is given.
    """
    state = unwrap_state_dict(checkpoint, strip_prefixes=('module.', 'backbone.'))
    if model.out_type != 'cls':
        for k in [k for k in state if k.startswith(_CLS_ONLY)]:
            del state[k]
            if dropped is not None:
                dropped[k] = 'ImageNet classifier head / final norm (a dense backbone has none)'
    return state
