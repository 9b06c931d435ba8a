"""VQGAN tokenizer (Esser et al., "Taming Transformers for High-Resolution Image Synthesis", 2021).

https://arxiv.org/abs/2012.09841 -- the discretizer of Dr-ViT and of Discrete Adversarial
Training. Compatible with the released taming-transformers checkpoints (f16 with 1024 or 16384
codes, the latent-diffusion f8 with 16384 codes) and with small tokenizers trained by
``tools/train_vq.py``.

Images go in as [0, 1] pixels (mapped to the network's [-1, 1] inside) and come back in [0, 1];
``encode`` gives code indices on a grid 1/f of the input, ``decode`` turns indices into images.
"""
import logging
import math
import os.path as osp
from contextlib import nullcontext
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.logging import print_log
from mmengine.model import BaseModule
from typing_extensions import override

from ...registry import MODELS
from ...utils.device import cpu_has_native_bf16
from ...utils.errors import InputNotFoundError
from ..checkpoint import CheckpointMismatchError, dropped_summary, load_state_dict_strict
from ..utils import resolve_arch

# -- blocks ----------------------------------------------------------------------------------------


NORMS = ('group', 'batch')


def _norm(channels: int, kind: str = 'group') -> nn.Module:
    """Taming's GroupNorm(32) (narrower models keep at least 4 channels per group).

    BatchNorm instead for small tokenizers trained from scratch.

    NOTE: with one channel per group the norm erases each channel's mean, so a small decoder
    could not reproduce flat colours (it learned only grey images). Even with 4 channels per
    group, GroupNorm over the 4x4 bottleneck of small training crops removes most of each
    image's colour statistics: a 32-filter f16 model stays below the mean-colour baseline for
    1000+ iterations on the toy images, where the same model with BatchNorm passes it in 600.
    """
    if kind == 'batch':
        return nn.BatchNorm2d(channels)
    if kind != 'group':
        raise ValueError(f'VQGAN norm must be one of {NORMS}, got {kind!r}')
    groups = math.gcd(min(32, max(channels // 4, 1)), channels)
    return nn.GroupNorm(num_groups=groups, num_channels=channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """GroupNorm → swish → 3x3 conv, twice, plus a 1x1 shortcut when the width changes."""

    def __init__(self, in_chs: int, out_chs: int, dropout: float = 0.0, norm: str = 'group'
                 ) -> None:
        super().__init__()
        self.norm1 = _norm(in_chs, norm)
        self.conv1 = nn.Conv2d(in_chs, out_chs, 3, padding=1)
        self.norm2 = _norm(out_chs, norm)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_chs, out_chs, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(in_chs, out_chs, 1) if in_chs != out_chs else None

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all positions, with 1x1 q/k/v/out projections."""

    def __init__(self, chs: int, norm: str = 'group') -> None:
        super().__init__()
        self.norm = _norm(chs, norm)
        self.q = nn.Conv2d(chs, chs, 1)
        self.k = nn.Conv2d(chs, chs, 1)
        self.v = nn.Conv2d(chs, chs, 1)
        self.proj_out = nn.Conv2d(chs, chs, 1)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (proj(y).flatten(2).transpose(1, 2)[:, None] for proj in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)  # scale c^-0.5: one head of width c
        return x + self.proj_out(out[:, 0].transpose(1, 2).reshape(b, c, h, w))


class Downsample(nn.Module):
    """3x3 stride-2 conv after padding right and bottom by one (taming's asymmetric padding)."""

    def __init__(self, chs: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(chs, chs, 3, stride=2)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    """Nearest-neighbour x2, then a 3x3 conv."""

    def __init__(self, chs: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(chs, chs, 3, padding=1)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode='nearest'))


class _Level(nn.Module):
    """One resolution level: res blocks (+ attention) and the resampling to the next level."""

    def __init__(self, blocks: Sequence[nn.Module], attns: Sequence[nn.Module],
                 resample: Optional[nn.Module], resample_name: str) -> None:
        super().__init__()
        self.block = nn.ModuleList(blocks)
        self.attn = nn.ModuleList(attns)
        if resample is not None:
            self.add_module(resample_name, resample)
        self.resample_name = resample_name if resample is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.block):
            x = block(x)
            if len(self.attn):
                x = self.attn[i](x)
        return x

    def resample(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.resample_name)(x) if self.resample_name else x


class _Mid(nn.Module):
    def __init__(self, chs: int, dropout: float, norm: str) -> None:
        super().__init__()
        self.block_1 = ResnetBlock(chs, chs, dropout, norm)
        self.attn_1 = AttnBlock(chs, norm)
        self.block_2 = ResnetBlock(chs, chs, dropout, norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))


# -- encoder / decoder / quantizer -----------------------------------------------------------------

class Encoder(nn.Module):
    """The VQGAN encoder: image to ``z_channels`` latents at 1 / 2^(len(ch_mult) - 1) scale."""

    def __init__(self, ch: int, ch_mult: Sequence[int], num_res_blocks: int,
                 attn_resolutions: Sequence[int], resolution: int, z_channels: int,
                 in_chs: int = 3, dropout: float = 0.0, norm: str = 'group') -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(in_chs, ch, 3, padding=1)
        self.down = nn.ModuleList()
        widths = [ch] + [ch * m for m in ch_mult]
        res = resolution
        for i in range(len(ch_mult)):
            blocks = [ResnetBlock(widths[i] if j == 0 else widths[i + 1], widths[i + 1], dropout,
                                  norm) for j in range(num_res_blocks)]
            attns = [AttnBlock(widths[i + 1], norm) for _ in range(num_res_blocks)] \
                if res in attn_resolutions else []
            last = i == len(ch_mult) - 1
            self.down.append(_Level(blocks, attns, None if last else Downsample(widths[i + 1]),
                                    'downsample'))
            res = res if last else res // 2
        self.mid = _Mid(widths[-1], dropout, norm)
        self.norm_out = _norm(widths[-1], norm)
        self.conv_out = nn.Conv2d(widths[-1], z_channels, 3, padding=1)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.down:
            h = level.resample(level(h))
        h = self.mid(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    """The VQGAN decoder: latents back to an image (the encoder's mirror)."""

    def __init__(self, ch: int, ch_mult: Sequence[int], num_res_blocks: int,
                 attn_resolutions: Sequence[int], resolution: int, z_channels: int,
                 out_chs: int = 3, dropout: float = 0.0, norm: str = 'group') -> None:
        super().__init__()
        widths = [ch * m for m in ch_mult]
        res = resolution // 2 ** (len(ch_mult) - 1)
        self.conv_in = nn.Conv2d(z_channels, widths[-1], 3, padding=1)
        self.mid = _Mid(widths[-1], dropout, norm)
        levels = []
        in_w = widths[-1]
        for i in reversed(range(len(ch_mult))):  # NOTE: built coarse to fine, indexed fine first
            blocks = []
            for _ in range(num_res_blocks + 1):
                blocks.append(ResnetBlock(in_w, widths[i], dropout, norm))
                in_w = widths[i]
            attns = [AttnBlock(widths[i], norm) for _ in blocks] if res in attn_resolutions else []
            levels.insert(0, _Level(blocks, attns, Upsample(in_w) if i > 0 else None,
                                    'upsample'))
            res = res * 2 if i > 0 else res
        self.up = nn.ModuleList(levels)
        self.norm_out = _norm(in_w, norm)
        self.conv_out = nn.Conv2d(in_w, out_chs, 3, padding=1)

    @override
    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            h = level.resample(level(h))
        return self.conv_out(F.silu(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    """Nearest-codebook-entry quantiser with the straight-through gradient (VQ-VAE).

    Distances ``|z|^2 + |e|^2 - 2 z.e`` are computed in fp32 whatever the autocast state, and
    the loss is the standard ``|sg[z] - e|^2 + beta |z - sg[e]|^2`` (taming's legacy version puts
    beta on the other term).
    """

    def __init__(self, n_embed: int, embed_dim: int, beta: float = 0.25) -> None:
        super().__init__()
        self.n_embed, self.embed_dim, self.beta = n_embed, embed_dim, beta
        self.embedding = nn.Embedding(n_embed, embed_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / n_embed, 1.0 / n_embed)

    def indices(self, z: torch.Tensor) -> torch.Tensor:
        """Code index (B, H, W) of every position of z (B, D, H, W)."""
        with torch.autocast(z.device.type, enabled=False):
            flat = z.float().permute(0, 2, 3, 1).reshape(-1, self.embed_dim)
            codebook = self.embedding.weight.float()
            dist = (flat.pow(2).sum(1, keepdim=True) + codebook.pow(2).sum(1)[None]
                    - 2 * flat @ codebook.t())
            return dist.argmin(1).view(z.shape[0], z.shape[2], z.shape[3])

    def lookup(self, indices: torch.Tensor) -> torch.Tensor:
        """Codebook vectors (B, D, H, W) of indices (B, H, W)."""
        return self.embedding(indices).permute(0, 3, 1, 2).contiguous()

    def forward(self, z: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(straight-through z_q, VQ loss, indices)."""
        indices = self.indices(z)
        z_q = self.lookup(indices).to(z.dtype)
        loss = F.mse_loss(z_q, z.detach()) + self.beta * F.mse_loss(z, z_q.detach())
        return z + (z_q - z).detach(), loss, indices


# -- model -----------------------------------------------------------------------------------------

@MODELS.register_module()
class VQGAN(BaseModule):
    """Encoder → 1x1 conv → vector quantiser → 1x1 conv → decoder.

    Args:
        arch: a name of :data:`VQGAN_ARCHS` or a dict with its keys, plus an optional
            ``norm``: ``'group'`` (taming's, the default) or ``'batch'`` (trains much faster
            from scratch on small crops; frozen tokenizers always run in eval mode, so their
            codes never depend on the batch).
        checkpoint: a taming / latent-diffusion ``.ckpt`` or a plain state dict, loaded strictly
            through :func:`checkpoint_filter_fn` (also via ``init_cfg``).
        chunk_size: images per encoder/decoder call (bounds memory at large resolutions).
        autocast: run the convolutions in fp16 (CUDA) / bf16 (a CPU with native bf16, i.e.
            AVX-512; elsewhere fp32, with a warning in the log) autocast; the distances of the
            quantiser always stay fp32.
        dropout: dropout in the res blocks (training only).
    """

    def __init__(self, arch: Union[str, dict] = 'f16_1024', checkpoint: Optional[str] = None,
                 chunk_size: int = 8, autocast: bool = False, dropout: float = 0.0,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.arch_name, settings = resolve_arch(arch, VQGAN_ARCHS, 'VQGAN', optional=('norm', ))
        self.settings = settings
        settings.setdefault('norm', 'group')
        net = {k: settings[k] for k in ('ch', 'ch_mult', 'num_res_blocks', 'attn_resolutions',
                                        'resolution', 'z_channels', 'norm')}
        self.encoder = Encoder(**net, dropout=dropout)
        self.decoder = Decoder(**net, dropout=dropout)
        self.quant_conv = nn.Conv2d(settings['z_channels'], settings['embed_dim'], 1)
        self.post_quant_conv = nn.Conv2d(settings['embed_dim'], settings['z_channels'], 1)
        self.quantize = VectorQuantizer(settings['n_embed'], settings['embed_dim'])
        self.factor = 2 ** (len(settings['ch_mult']) - 1)
        self.chunk_size = chunk_size
        self.autocast = autocast
        self._amp_fallback_logged = False
        if checkpoint:
            self.load_checkpoint(checkpoint)

    @property
    def n_embed(self) -> int:
        """The codebook size."""
        return self.quantize.n_embed

    @property
    def embed_dim(self) -> int:
        """The code dimension."""
        return self.quantize.embed_dim

    def load_checkpoint(self, path: str) -> None:
        """Load a taming/latent-diffusion ``.ckpt`` or a state dict, strictly and safely."""
        from ..checkpoint import load_tokenizer_checkpoint
        if not osp.isfile(osp.expanduser(path)):
            raise InputNotFoundError(
                f'VQGAN: tokenizer checkpoint {path!r} not found (resolved from '
                f'{osp.abspath(".")}). Train one on your images with `python tools/train_vq.py '
                'CONFIG` (configs/tokenizers/vq-small-f16_toy-coco.py for the toy data), or put '
                'a taming / latent-diffusion .ckpt there.')
        dropped: Dict[str, str] = {}
        state = checkpoint_filter_fn(load_tokenizer_checkpoint(path), self, dropped)
        load_state_dict_strict(self, state, source=f'VQGAN checkpoint {path}')
        print_log(f'VQGAN({self.arch_name}): loaded all {len(state)} tensors from {path}'
                  + (f'\n{dropped_summary(dropped)}' if dropped else ''), logger='current',
                  level=logging.INFO)

    def init_weights(self) -> None:
        """Load ``init_cfg``'s checkpoint; otherwise keep the weights (built or loaded)."""
        if self.init_cfg and self.init_cfg.get('type') == 'Pretrained':
            self.load_checkpoint(self.init_cfg['checkpoint'])
        self._is_init = True

    # -- running -----------------------------------------------------------------------------------
    def _amp(self, x: torch.Tensor):
        if not self.autocast:  # NOTE: off, even inside the trainer's --amp autocast
            return torch.autocast(x.device.type, enabled=False) \
                if x.device.type in ('cuda', 'cpu') else nullcontext()
        if x.device.type == 'cuda':
            return torch.autocast('cuda', dtype=torch.float16)
        if x.device.type == 'cpu' and cpu_has_native_bf16():
            return torch.autocast('cpu', dtype=torch.bfloat16)
        if not self._amp_fallback_logged:
            self._amp_fallback_logged = True
            print_log(f'VQGAN: autocast=True, but this {x.device.type.upper()} has no native '
                      'low-precision convolutions (bfloat16 needs AVX-512 on a CPU), where they '
                      'are far slower than float32: the tokenizer runs in float32',
                      logger='current', level=logging.WARNING)
        return nullcontext()

    def _check_size(self, x: torch.Tensor) -> None:
        if x.dim() != 4 or x.shape[1] != 3:
            raise ValueError(f'VQGAN expects (B, 3, H, W) images in [0, 1], got {tuple(x.shape)}')
        if x.shape[-2] % self.factor or x.shape[-1] % self.factor:
            raise ValueError(f'VQGAN ({self.arch_name}, factor {self.factor}) needs H and W '
                             f'divisible by {self.factor}, got {tuple(x.shape[-2:])}; pad first.')

    def encode_latent(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-quantisation latents (B, embed_dim, H/f, W/f) of [0, 1] images."""
        self._check_size(x)
        outs = []
        for chunk in x.split(self.chunk_size):
            with self._amp(chunk):
                outs.append(self.quant_conv(self.encoder(chunk * 2 - 1)).float())
        return torch.cat(outs)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Code indices (B, H/f, W/f) of [0, 1] images."""
        return self.quantize.indices(self.encode_latent(x))

    def decode_latent(self, z_q: torch.Tensor) -> torch.Tensor:
        """Images from quantized latents, in chunks."""
        outs = []
        for chunk in z_q.split(self.chunk_size):
            with self._amp(chunk):
                outs.append(self.decoder(self.post_quant_conv(chunk)).float())
        return ((torch.cat(outs).clamp(-1, 1) + 1) / 2)

    def decode(self, indices: torch.Tensor) -> torch.Tensor:
        """[0, 1] images from code indices (B, h, w)."""
        return self.decode_latent(self.quantize.lookup(indices))

    def reconstruct(self, x: torch.Tensor) -> torch.Tensor:
        """Q(x): encode, quantise, decode ([0, 1] in and out)."""
        return self.decode(self.encode(x))

    def forward(self, x: torch.Tensor, quantize: bool = True
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Training pass: (reconstruction in [0, 1] before clamping, VQ loss, indices).

        ``quantize=False`` (a trainer's autoencoder warm-up) decodes the latents themselves;
        the quantiser still runs, its loss at weight 0, so that every parameter takes part in
        the backward pass (DDP without ``find_unused_parameters``).
        """
        self._check_size(x)
        with self._amp(x):
            z = self.quant_conv(self.encoder(x * 2 - 1)).float()
        z_q, vq_loss, indices = self.quantize(z)
        if not quantize:
            z_q, vq_loss = z, vq_loss * 0
        with self._amp(x):
            rec = self.decoder(self.post_quant_conv(z_q)).float()
        return (rec + 1) / 2, vq_loss, indices


def quantize_images(tokenizer: nn.Module, pixels: torch.Tensor
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantize images of any size with any tokenizer.

    (Q(pixels), codes) of [0, 1] RGB images of any size, for any tokenizer with ``encode``,
    ``decode`` and ``factor``: replicate-padded to a multiple of the factor, cropped back.
    """
    f = tokenizer.factor
    h, w = pixels.shape[-2:]
    ph, pw = -h % f, -w % f
    padded = F.pad(pixels, (0, pw, 0, ph), mode='replicate') if ph or pw else pixels
    codes = tokenizer.encode(padded)
    return tokenizer.decode(codes)[..., :h, :w], codes


# -- checkpoints and variants ----------------------------------------------------------------------

#: Prefixes of the tokenizer inside the official files (the rest: loss.* LPIPS/discriminator).
TOKENIZER_PREFIXES = ('encoder.', 'decoder.', 'quantize.', 'quant_conv.', 'post_quant_conv.')


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: Optional[VQGAN] = None,
                         dropped: Optional[Dict[str, str]] = None) -> Dict[str, torch.Tensor]:
    """The tokenizer's weights of an official taming / latent-diffusion checkpoint.

    Keeps the encoder, decoder, quantiser and the two 1x1 convs (a ``model.``, ``module.`` or
    ``tokenizer.`` wrapper prefix is removed: the last is mmrobust's Runner checkpoints of
    :class:`VQTokenizerTrainer`); drops ``loss.*`` (taming's LPIPS and discriminator, the
    trainer's discriminator and statistics) and anything else. The key names are the model's
    own, so nothing is renamed. Dropped keys go to ``dropped`` (key -> reason) when it is given.
    """
    for wrapper in ('model.', 'module.', 'first_stage_model.', 'tokenizer.'):
        if state_dict and all(k.startswith(wrapper) for k in state_dict
                              if not k.startswith('loss.')):
            state_dict = {k[len(wrapper):] if k.startswith(wrapper) else k: v
                          for k, v in state_dict.items()}
    kept = {k: v for k, v in state_dict.items() if k.startswith(TOKENIZER_PREFIXES)}
    if dropped is not None:
        dropped.update({k: ('training loss (LPIPS / discriminator / statistics), not the '
                            'tokenizer' if k.startswith('loss.') else
                            'not part of the tokenizer (encoder, decoder, quantizer)')
                        for k in state_dict if k not in kept})
    if not kept:
        raise CheckpointMismatchError(
            'the checkpoint holds no VQGAN weights (no keys starting with '
            f'{", ".join(TOKENIZER_PREFIXES)}); first keys: {sorted(state_dict)[:10]}')
    return kept


# ch, ch_mult, num_res_blocks, attn_resolutions, resolution, z_channels, embed_dim, n_embed
# (+ optional norm: 'group', taming's and the default, or 'batch')
VQGAN_ARCHS: Dict[str, dict] = {
    # taming-transformers ImageNet f16 (72,141,699 / 76,073,859 parameters)
    'f16_1024': dict(ch=128, ch_mult=(1, 1, 2, 2, 4), num_res_blocks=2, attn_resolutions=(16,),
                     resolution=256, z_channels=256, embed_dim=256, n_embed=1024),
    'f16_16384': dict(ch=128, ch_mult=(1, 1, 2, 2, 4), num_res_blocks=2,
                      attn_resolutions=(16,), resolution=256, z_channels=256, embed_dim=256,
                      n_embed=16384),
    # latent-diffusion "vq-f8" OpenImages (67,717,295 parameters)
    'f8_16384': dict(ch=128, ch_mult=(1, 2, 2, 4), num_res_blocks=2, attn_resolutions=(32,),
                     resolution=256, z_channels=4, embed_dim=4, n_embed=16384),
    # Dr-ViT's "small VQ encoder": 1 res block per level, 64 filters (2.63M encoder / 7.12M
    # parameters), f16 with 1024 codes of width 256; trained by tools/train_vq.py
    'small_f16': dict(ch=64, ch_mult=(1, 2, 2, 2, 2), num_res_blocks=1, attn_resolutions=(),
                      resolution=256, z_channels=256, embed_dim=256, n_embed=1024),
}
