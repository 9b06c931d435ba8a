"""Dr-ViT: a ViT on discrete VQ tokens, as a dense backbone.

Mao et al., "Discrete Representations Strengthen Vision Transformer Robustness", ICLR 2022
(https://arxiv.org/abs/2111.10493). Each 16x16 patch is represented by the codebook vector of
its VQ code (a frozen tokenizer, stop-gradient) concatenated with a small 32-d pixel embedding
and zero-padded to the ViT width; the codebook is fine-tuned as a zero-initialised delta (give
it its own LR multiplier with ``paramwise_cfg.custom_keys={'code_delta': ...}``). For detection
and segmentation the stride-16 output becomes a 4-level pyramid (strides 4, 8, 16, 32) with
ViTDet's simple feature pyramid, so the backbone drops into FPN.
"""
import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks import DropPath
from typing_extensions import override

from ...registry import MODELS
from ..checkpoint import CheckpointMismatchError, unwrap_state_dict
from ..layers import LayerNorm2d, Mlp
from ..utils import init_trunc_normal_
from .base import DenseBackbone

__all__ = ['DrViT', 'checkpoint_filter_fn']

TOKEN_MODES = ('concat', 'discrete', 'pixel', 'add', 'gated', 'cross_attn')

# -- blocks ----------------------------------------------------------------------------------------


class Attention(nn.Module):
    """Multi-head self-attention with a fused qkv projection (timm's key layout)."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads) \
            .permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, drop_path: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class CodeCrossAttention(nn.Module):
    """Pixel tokens attend to the code tokens (the cross-attention fusion ablation)."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, dim * 2)
        self.proj = nn.Linear(dim, dim)

    def forward(self, pixels: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        b, n, c = pixels.shape
        heads = self.num_heads
        q = self.q(self.norm(pixels)).reshape(b, n, heads, c // heads).transpose(1, 2)
        k, v = self.kv(codes).reshape(b, -1, 2, heads, c // heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c)
        return pixels + self.proj(out)


class SimpleFeaturePyramid(nn.Module):
    """ViTDet's pyramid from one stride-16 map: 2 and 1 deconvs up, identity, max-pool down."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up4 = nn.Sequential(nn.ConvTranspose2d(dim, dim // 2, 2, 2), LayerNorm2d(dim // 2),
                                 nn.GELU(), nn.ConvTranspose2d(dim // 2, dim // 4, 2, 2))
        self.up2 = nn.ConvTranspose2d(dim, dim // 2, 2, 2)
        self.down2 = nn.MaxPool2d(2, ceil_mode=True)

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        return [self.up4(x), self.up2(x), x, self.down2(x)]


# -- model -----------------------------------------------------------------------------------------

@MODELS.register_module()
class DrViT(DenseBackbone):
    """Dr-ViT backbone: VQ-code + pixel tokens → ViT → 4-level pyramid.

    Args:
        arch: ``tiny`` / ``small`` / ``base`` (ViT-Ti/S/B, patch 16) or a dict with the keys of
            :attr:`arch_zoo`.
        tokenizer: config of the frozen tokenizer (``type='VQGAN'``, with ``checkpoint=...``); its
            downsampling factor must be 16 (codes on the patch grid) or 8 (reduced by a learned
            2x2 stride-2 conv). Codes are computed without gradient.
        token_mode: how patch tokens are formed; default per arch (``concat`` for S/B,
            ``discrete`` for Ti). ``concat``: [pixel 32-d | code | zeros] (the paper);
            ``discrete``: [code | zeros] (projected to the width if it is narrower);
            ``pixel``: a plain ViT patch embedding; ``add`` / ``gated`` / ``cross_attn``: the
            paper's weaker fusion ablations.
        pixel_dims: width of the pixel embedding in ``concat`` mode.
        img_norm: (mean, std) in 0-255 units that the data preprocessor applied, to recover
            [0, 1] pixels for the tokenizer (default: ImageNet's, as mmdet/mmseg configs).
        pretrain_img_size: image size the position embedding is defined for (interpolated to any
            input size).
        out_indices: pyramid levels to return (0..3: strides 4, 8, 16, 32).
        frozen_stages: -1: none; 0: the token embeddings; k >= 1: also the first k quarters of
            the transformer blocks.
        norm_eval: keep normalisation layers in eval mode (there is no BN; for API parity).
        with_cp: gradient checkpointing of every block (same outputs, less memory).
        drop_path_rate: stochastic depth, linear over the blocks.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH)`` loads a timm / DeiT ViT into the
            transformer part, strictly (see :func:`checkpoint_filter_fn`).
    """

    # embed_dims, depth, num_heads, mlp_ratio, token_mode
    arch_zoo = {
        'tiny': dict(embed_dims=192, depth=12, num_heads=3, mlp_ratio=4.0, token_mode='discrete'),
        'small': dict(embed_dims=384, depth=12, num_heads=6, mlp_ratio=4.0, token_mode='concat'),
        'base': dict(embed_dims=768, depth=12, num_heads=12, mlp_ratio=4.0, token_mode='concat'),
    }
    patch_size = 16

    def __init__(self, arch: Union[str, dict] = 'small',
                 tokenizer: Optional[dict] = None,
                 token_mode: Optional[str] = None,
                 pixel_dims: int = 32,
                 img_norm: Tuple[Sequence[float], Sequence[float]] = (
                     (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)),
                 pretrain_img_size: int = 224,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 drop_path_rate: float = 0.1,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(arch, out_indices, 4, frozen_stages, norm_eval, init_cfg, with_cp)
        dim, depth = self.arch['embed_dims'], self.arch['depth']
        self.token_mode = token_mode or self.arch['token_mode']
        if self.token_mode not in TOKEN_MODES:
            raise ValueError(f'token_mode must be one of {TOKEN_MODES}, got {self.token_mode!r}')
        self.embed_dims = dim
        self.register_buffer('img_mean', torch.tensor(img_norm[0]).view(1, 3, 1, 1) / 255,
                             persistent=False)
        self.register_buffer('img_std', torch.tensor(img_norm[1]).view(1, 3, 1, 1) / 255,
                             persistent=False)

        # -- tokens --------------------------------------------------------------------------------
        self.tokenizer = None
        if self.token_mode != 'pixel':
            if tokenizer is None:
                raise ValueError(f'token_mode={self.token_mode!r} needs a tokenizer, e.g. '
                                 "tokenizer=dict(type='VQGAN', arch='small_f16', "
                                 "checkpoint='checkpoints/vq_small_f16.pth')")
            self.tokenizer = MODELS.build(tokenizer)
            self.tokenizer.requires_grad_(False)
            self.tokenizer.eval()
            factor = self.tokenizer.factor
            if factor not in (8, 16):
                raise ValueError(f'the tokenizer downsamples by {factor}; Dr-ViT needs 16 (codes '
                                 'on the patch grid) or 8 (reduced by a learned 2x2 conv)')
            code_dim = self.tokenizer.embed_dim
            # NOTE: the frozen codebook is read from the tokenizer at run time (its checkpoint
            # may load after this module is built); only the zero-initialised delta trains
            self.code_delta = nn.Parameter(torch.zeros(self.tokenizer.n_embed, code_dim))
            self.code_reduce = nn.Conv2d(code_dim, code_dim, 2, 2) if factor == 8 else None
        pixel_width = {'concat': pixel_dims, 'discrete': 0}.get(self.token_mode, dim)
        if pixel_width:
            self.pixel_embed = nn.Conv2d(3, pixel_width, self.patch_size, self.patch_size)
        if self.token_mode == 'concat' and pixel_dims + code_dim > dim:
            raise ValueError(f'concat tokens need width >= {pixel_dims + code_dim}, ViT has {dim}')
        if self.token_mode == 'discrete':
            self.code_proj = nn.Linear(code_dim, dim) if code_dim > dim else None
        elif self.token_mode in ('add', 'gated', 'cross_attn'):
            self.code_proj = nn.Linear(code_dim, dim)
            if self.token_mode == 'gated':
                self.gate = nn.Parameter(torch.zeros(dim))
            if self.token_mode == 'cross_attn':
                self.cross_attn = CodeCrossAttention(dim, self.arch['num_heads'])

        # -- transformer ---------------------------------------------------------------------------
        self.pretrain_grid = pretrain_img_size // self.patch_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.pretrain_grid ** 2, dim))
        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.ModuleList(
            Block(dim, self.arch['num_heads'], self.arch['mlp_ratio'], dpr[i])
            for i in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pyramid = SimpleFeaturePyramid(dim)
        self.feature_info = [dict(num_chs=c, reduction=r)
                             for c, r in zip((dim // 4, dim // 2, dim, dim), (4, 8, 16, 32))]

    # -- structure ---------------------------------------------------------------------------------
    def _embedding_modules(self) -> List[nn.Module]:
        names = ('pixel_embed', 'code_reduce', 'code_proj', 'cross_attn')
        return [m for m in (getattr(self, n, None) for n in names) if m is not None]

    def _stage_groups(self) -> List[List[nn.Module]]:
        quarter = math.ceil(len(self.blocks) / 4)
        blocks = list(self.blocks)
        return [self._embedding_modules()] + [blocks[i * quarter:(i + 1) * quarter]
                                              for i in range(4)]

    def _freeze_stages(self) -> None:
        super()._freeze_stages()
        if self.frozen_stages >= 0:  # the loose parameters of the token embedding group
            for name in ('cls_token', 'pos_embed', 'code_delta', 'gate'):
                param = getattr(self, name, None)
                if isinstance(param, nn.Parameter):
                    param.requires_grad = False

    @override
    def train(self, mode: bool = True) -> 'DrViT':
        super().train(mode)
        if self.tokenizer is not None:
            self.tokenizer.eval()  # NOTE: frozen, always in eval mode
        return self

    def _init_from_scratch(self) -> None:
        init_trunc_normal_(self, skip=[self.tokenizer] if self.tokenizer is not None else [])
        nn.init.trunc_normal_(self.pos_embed, std=.02)
        nn.init.trunc_normal_(self.cls_token, std=.02)
        if self.tokenizer is not None:
            nn.init.zeros_(self.code_delta)
            self.tokenizer.init_weights()  # NOTE: loads the tokenizer's own init_cfg checkpoint

    @override
    def convert_checkpoint(self, checkpoint: dict, dropped: Optional[Dict[str, str]] = None
                           ) -> Dict[str, torch.Tensor]:
        state = checkpoint_filter_fn(checkpoint, self, dropped)
        if self.tokenizer is not None:  # the tokenizer keeps its own (already loaded) weights
            state.update({f'tokenizer.{k}': v for k, v in self.tokenizer.state_dict().items()})
        return state

    def newly_added(self) -> Tuple[str, ...]:
        """What a timm / DeiT ViT cannot provide: Dr-ViT's token layers and the pyramid."""
        new = ['pyramid.', 'code_delta', 'code_reduce.', 'code_proj.', 'gate', 'cross_attn.']
        if self.token_mode != 'pixel':
            new.append('pixel_embed.')
        return tuple(new)

    # -- forward -----------------------------------------------------------------------------------
    def _tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Patch tokens (B, D, H/16, W/16) of a normalised, 16-divisible batch."""
        pixels = self.pixel_embed(x) if hasattr(self, 'pixel_embed') else None
        if self.tokenizer is None:
            return pixels
        with torch.no_grad():
            images = (x * self.img_std + self.img_mean).clamp(0, 1)
            codes = self.tokenizer.encode(images)
        codebook = self.tokenizer.quantize.embedding.weight.detach() + self.code_delta
        embedded = F.embedding(codes, codebook).permute(0, 3, 1, 2)
        if self.code_reduce is not None:
            embedded = self.code_reduce(embedded)
        b, _, h, w = embedded.shape
        if self.token_mode == 'concat':
            pad = self.embed_dims - pixels.shape[1] - embedded.shape[1]
            return torch.cat([pixels, embedded, embedded.new_zeros(b, pad, h, w)], 1)
        if self.token_mode == 'discrete':
            if self.code_proj is not None:
                return self.code_proj(embedded.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            pad = self.embed_dims - embedded.shape[1]
            return torch.cat([embedded, embedded.new_zeros(b, pad, h, w)], 1)
        codes_d = self.code_proj(embedded.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        if self.token_mode == 'add':
            return pixels + codes_d
        if self.token_mode == 'gated':
            return pixels + torch.sigmoid(self.gate).view(1, -1, 1, 1) * codes_d
        q = pixels.flatten(2).transpose(1, 2)
        fused = self.cross_attn(q, codes_d.flatten(2).transpose(1, 2))
        return fused.transpose(1, 2).reshape(b, -1, h, w)

    def _pos_embed(self, h: int, w: int) -> torch.Tensor:
        cls_pos, grid = self.pos_embed[:, :1], self.pos_embed[:, 1:]
        if (h, w) != (self.pretrain_grid, self.pretrain_grid):
            grid = grid.reshape(1, self.pretrain_grid, self.pretrain_grid, -1).permute(0, 3, 1, 2)
            grid = F.interpolate(grid, size=(h, w), mode='bicubic', align_corners=False)
            grid = grid.flatten(2).transpose(1, 2)
        return torch.cat([cls_pos, grid], 1)

    @override
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        in_h, in_w = x.shape[-2:]
        multiple = self.patch_size * 2  # NOTE: the stride-32 level needs an even grid
        pad_h, pad_w = (-in_h) % multiple, (-in_w) % multiple
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))
        tokens = self._tokens(x)
        b, c, h, w = tokens.shape
        seq = torch.cat([self.cls_token.expand(b, -1, -1), tokens.flatten(2).transpose(1, 2)], 1)
        seq = seq + self._pos_embed(h, w)
        for block in self.blocks:
            seq = self._run_block(block, seq)
        feat = self.norm(seq[:, 1:]).transpose(1, 2).reshape(b, c, h, w)
        outs = []
        for i, level in enumerate(self.pyramid(feat)):
            if i in self.out_indices:
                stride = self.feature_info[i]['reduction']
                outs.append(self._dense_output(level, in_h, in_w, stride))
        return tuple(outs)


# -- checkpoints -----------------------------------------------------------------------------------

#: keys of a timm / DeiT classifier that a dense Dr-ViT does not use
_CLASSIFIER_KEYS = ('head.', 'head_dist.', 'dist_token', 'fc_norm.', 'pre_logits.')


def checkpoint_filter_fn(checkpoint: dict, model: DrViT,
                         dropped: Optional[Dict[str, str]] = None) -> Dict[str, torch.Tensor]:
    """A timm / DeiT ViT checkpoint as Dr-ViT transformer weights.

    Keeps ``cls_token``, ``pos_embed`` (resampled bicubically to the model's pretraining grid),
    ``blocks.*`` and ``norm.*``; the plain patch embedding becomes the pixel embedding only in
    ``pixel`` mode (other modes have a narrower pixel embedding). Classifier heads and the
    distillation token are dropped (into ``dropped``, key -> reason, when it is given).
    """
    dropped = {} if dropped is None else dropped
    state = unwrap_state_dict(checkpoint)
    if 'blocks.0.attn.qkv.weight' not in state:
        raise CheckpointMismatchError(
            'not a timm / DeiT ViT checkpoint (no blocks.0.attn.qkv.weight); first keys: '
            f'{sorted(state)[:10]}')
    out = {}
    for key, value in state.items():
        if key.startswith(_CLASSIFIER_KEYS):
            dropped[key] = 'ImageNet classifier / distillation token (a dense backbone has none)'
            continue
        if key.startswith('patch_embed.proj.'):
            if model.token_mode == 'pixel':
                out['pixel_embed.' + key[len('patch_embed.proj.'):]] = value
            else:
                dropped[key] = (f'RGB patch embedding: token_mode={model.token_mode!r} embeds '
                                'codes (and a narrower pixel embedding, trained from scratch)')
            continue
        if key == 'pos_embed':
            extra = 2 if 'dist_token' in state else 1
            grid = value[:, extra:]
            side = int(round(math.sqrt(grid.shape[1])))
            if side != model.pretrain_grid:
                grid = grid.reshape(1, side, side, -1).permute(0, 3, 1, 2)
                grid = F.interpolate(grid.float(), size=(model.pretrain_grid,) * 2,
                                     mode='bicubic', align_corners=False)
                grid = grid.flatten(2).transpose(1, 2)
            value = torch.cat([value[:, :1], grid], 1)
        out[key] = value
    return out
