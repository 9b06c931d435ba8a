"""Train a VQ tokenizer (VQ-VAE / small VQGAN) on the images of any mmdet / mmseg dataset.

Dr-ViT's stage 1 and the discretizer of DAT. The images come without labels from the dataset of
a detection or segmentation config; the loss is the standard VQ-VAE loss (reconstruction +
``|sg[z] - e|^2 + beta |z - sg[e]|^2``, straight-through), optionally with a PatchGAN term.
The codebook is learned by that loss or, with ``codebook_ema``, updated by exponential moving
averages. Codebook usage is tracked (perplexity, used codes) and dead codes are re-initialised
from encoder outputs. Reconstruction previews and checkpoints are written to the work dir; the
checkpoint is a plain state dict that ``VQGAN(checkpoint=...)`` loads strictly.
"""
import json
import math
import os
import os.path as osp
import random
import time
from typing import Dict, List, Tuple

import cv2
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.config import Config

from ..datasets.image_crops import ImageCrops, dataset_image_paths
from ..registry import MODELS
from ..utils.io import atomic_image, atomic_json, atomic_write

# -- losses and statistics -------------------------------------------------------------------------


class PatchDiscriminator(nn.Module):
    """A small PatchGAN (for the optional adversarial term)."""

    def __init__(self, width: int = 64, layers: int = 3) -> None:
        super().__init__()
        mods: List[nn.Module] = [nn.Conv2d(3, width, 4, 2, 1), nn.LeakyReLU(0.2)]
        chs = width
        for i in range(1, layers):
            mods += [nn.Conv2d(chs, chs * 2, 4, 2, 1), nn.GroupNorm(8, chs * 2), nn.LeakyReLU(0.2)]
            chs *= 2
        mods.append(nn.Conv2d(chs, 1, 4, 1, 1))
        self.net = nn.Sequential(*mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x * 2 - 1)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = F.mse_loss(a.clamp(0, 1), b.clamp(0, 1)).item()
    return float('inf') if mse == 0 else 10 * math.log10(1.0 / mse)


def baselines(images: torch.Tensor, factor: int) -> Dict[str, float]:
    """PSNR of two trivial reconstructions: each image's mean colour, and its blur to the
    tokenizer's grid (average over each factor x factor cell, bilinear back up)."""
    mean = images.mean(dim=(2, 3), keepdim=True).expand_as(images)
    blur = F.interpolate(F.avg_pool2d(images, factor), size=images.shape[-2:], mode='bilinear',
                         align_corners=False)
    return {'psnr_mean_image': psnr(mean, images), 'psnr_blur': psnr(blur, images)}


def code_stats(counts: torch.Tensor) -> Dict[str, float]:
    """Perplexity and number of used codes of a code histogram."""
    probs = counts.float() / counts.sum().clamp(min=1)
    entropy = -(probs[probs > 0] * probs[probs > 0].log()).sum()
    return {'perplexity': float(entropy.exp()), 'used_codes': int((counts > 0).sum())}


# -- training --------------------------------------------------------------------------------------

DEFAULTS = dict(iters=1000, batch_size=8, crop_size=128, scale_range=(0.5, 1.0),
                eval_crop_size=None, lr=2e-4, lr_schedule='constant', betas=(0.5, 0.9),
                weight_decay=0.0, num_workers=2, recon_loss='l1', codebook_ema=0.0,
                gan_weight=0.0, gan_start=0, dead_code_interval=100, log_interval=20,
                preview_interval=200, checkpoint_interval=500, eval_images=16, seed=0)


class CodebookEMA:
    """The VQ-VAE codebook update by exponential moving averages (van den Oord et al. 2017,
    appendix; VQ-VAE-2) instead of the loss ``|sg[z] - e|^2``: each code becomes the running
    mean of the latents assigned to it. The codes then follow a fast-moving encoder at once,
    where Adam moves them by about one learning rate per step."""

    def __init__(self, codebook: torch.Tensor, decay: float, eps: float = 1e-5) -> None:
        if not 0 < decay < 1:
            raise ValueError(f'codebook_ema must be in (0, 1) (or 0 to learn the codebook by '
                             f'the loss), got {decay}')
        self.codebook, self.decay, self.eps = codebook, decay, eps
        self.cluster_size = torch.ones(len(codebook))
        self.embed_sum = codebook.detach().clone()

    @torch.no_grad()
    def update(self, z: torch.Tensor, codes: torch.Tensor) -> None:
        """One step from latents z (B, D, H, W) and their codes (B, H, W)."""
        flat = z.detach().float().permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        idx = codes.flatten()
        counts = torch.bincount(idx, minlength=len(self.codebook)).float()
        sums = torch.zeros_like(self.embed_sum).index_add_(0, idx, flat)
        self.cluster_size.mul_(self.decay).add_(counts, alpha=1 - self.decay)
        self.embed_sum.mul_(self.decay).add_(sums, alpha=1 - self.decay)
        # NOTE: Laplace smoothing, so codes that lose all their latents do not divide by ~0
        n = self.cluster_size.sum()
        size = (self.cluster_size + self.eps) / (n + len(self.codebook) * self.eps) * n
        self.codebook.copy_(self.embed_sum / size[:, None])

    @torch.no_grad()
    def reset(self, index: torch.Tensor, vectors: torch.Tensor) -> None:
        """Restart codes ``index`` at ``vectors`` (dead-code re-initialisation)."""
        self.codebook[index] = vectors
        self.embed_sum[index] = vectors
        self.cluster_size[index] = 1.0

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return {'cluster_size': self.cluster_size, 'embed_sum': self.embed_sum}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        self.cluster_size, self.embed_sum = state['cluster_size'], state['embed_sum']


def _atomic_save(obj, path: str) -> None:
    with atomic_write(path, 'wb') as f:
        torch.save(obj, f)


def _preview(originals: torch.Tensor, recons: torch.Tensor, path: str) -> None:
    """A PNG with originals (top row) above their reconstructions (bottom row)."""
    top = torch.cat(list(originals[:8]), dim=2)
    bottom = torch.cat(list(recons[:8].clamp(0, 1)), dim=2)
    grid = (torch.cat([top, bottom], dim=1).permute(1, 2, 0).numpy() * 255).round()
    atomic_image(path, cv2.cvtColor(grid.astype(np.uint8), cv2.COLOR_RGB2BGR))


@torch.no_grad()
def evaluate(model, images: torch.Tensor) -> Tuple[Dict[str, float], torch.Tensor]:
    """(PSNR, perplexity and used codes, reconstructions) of held-out images."""
    model.eval()
    codes = model.encode(images)
    recon = model.decode(codes)
    counts = torch.bincount(codes.flatten(), minlength=model.n_embed)
    model.train()
    return {'psnr': psnr(recon, images), **code_stats(counts)}, recon


def train_vq(cfg: Config, work_dir: str, resume: bool = False) -> Dict[str, float]:
    """Train the tokenizer of ``cfg`` (keys: ``model``, ``data``, ``train``); returns the final
    evaluation (PSNR, perplexity, used codes, baselines), also written to the work dir."""
    opts = dict(DEFAULTS, **cfg.get('train', {}))
    unknown = set(cfg.get('train', {})) - set(DEFAULTS)
    if unknown:
        raise KeyError(f'unknown train options {sorted(unknown)}; valid: {sorted(DEFAULTS)}')
    for key, choices in (('recon_loss', ('l1', 'mse')), ('lr_schedule', ('constant', 'cosine'))):
        if opts[key] not in choices:
            raise ValueError(f'train.{key} must be one of {choices}, got {opts[key]!r}')
    random.seed(opts['seed'])
    torch.manual_seed(opts['seed'])
    os.makedirs(osp.join(work_dir, 'previews'), exist_ok=True)
    data = cfg['data']
    model = MODELS.build(cfg['model']).train()
    eval_crop = opts['eval_crop_size'] or opts['crop_size']
    for key, size in (('crop_size', opts['crop_size']), ('eval_crop_size', eval_crop)):
        if size % model.factor:
            raise ValueError(f'{key} {size} must be a multiple of the tokenizer factor '
                             f'{model.factor}')
    train_paths = dataset_image_paths(data['config'], data.get('train', 'train_dataloader'))
    train_set = ImageCrops(train_paths, opts['crop_size'], train=True,
                           scale_range=opts['scale_range'])
    eval_paths = dataset_image_paths(data['config'], data.get('val', 'val_dataloader'))
    eval_set = ImageCrops(eval_paths[:opts['eval_images']], eval_crop, train=False,
                          scale_range=opts['scale_range'])
    eval_images = torch.stack([eval_set[i] for i in range(len(eval_set))])

    codebook = model.quantize.embedding.weight
    ema = CodebookEMA(codebook.data, opts['codebook_ema']) if opts['codebook_ema'] else None
    # NOTE: with the EMA update the codebook is not the optimiser's (its loss gradient is unused)
    learned = [p for p in model.parameters() if ema is None or p is not codebook]
    optimizer = torch.optim.Adam(learned, lr=opts['lr'], betas=tuple(opts['betas']),
                                 weight_decay=opts['weight_decay'])
    total = max(opts['iters'], 1)
    # NOTE: a function of the iteration alone, so a resumed run continues the same curve
    lr_at = ((lambda i: 0.5 * (1 + math.cos(math.pi * min(i, total) / total)))
             if opts['lr_schedule'] == 'cosine' else (lambda i: 1.0))
    latents = {}
    if ema is not None:
        model.quantize.register_forward_hook(lambda mod, args, out: latents.update(z=args[0]))
    disc = disc_opt = None
    if opts['gan_weight'] > 0:
        disc = PatchDiscriminator()
        disc_opt = torch.optim.Adam(disc.parameters(), lr=opts['lr'], betas=tuple(opts['betas']))
    state_path = osp.join(work_dir, 'latest_state.pth')
    start = 0
    if resume and osp.isfile(state_path):
        from ..utils import safe_load
        state = safe_load(state_path)
        if (ema is None) != ('codebook_ema' not in state):
            raise KeyError(f"{state_path} was trained {'with' if ema is None else 'without'} "
                           'codebook_ema; resume with the same train options or start a new work '
                           'dir')
        model.load_state_dict(state['model'])
        optimizer.load_state_dict(state['optimizer'])
        if disc is not None and 'disc' in state:
            disc.load_state_dict(state['disc'])
            disc_opt.load_state_dict(state['disc_opt'])
        if ema is not None:
            ema.load_state_dict(state['codebook_ema'])
        start = int(state['iter'])

    @torch.no_grad()
    def restart_codes(index: torch.Tensor, images: torch.Tensor) -> None:
        """Move codes `index` to random encoder outputs of `images` (slightly jittered)."""
        z = model.encode_latent(images).permute(0, 2, 3, 1).reshape(-1, model.embed_dim)
        pick = z[torch.randint(len(z), (len(index), ))]
        pick = pick + 1e-3 * torch.randn_like(pick)
        codebook[index] = pick
        if ema is not None:
            ema.reset(index, pick)

    loader = torch.utils.data.DataLoader(
        train_set, batch_size=opts['batch_size'], shuffle=True, drop_last=True,
        num_workers=opts['num_workers'], persistent_workers=opts['num_workers'] > 0)
    recon_fn = F.l1_loss if opts['recon_loss'] == 'l1' else F.mse_loss
    usage = torch.zeros(model.n_embed, dtype=torch.long)
    log_path = osp.join(work_dir, 'log.jsonl')
    from tqdm import tqdm
    bar = tqdm(total=opts['iters'], initial=start, unit='it', desc='train_vq', dynamic_ncols=True)
    it, t0 = start, time.time()
    shown: Dict[str, float] = {}  # the latest evaluation, for the progress bar
    while it < opts['iters']:
        for images in loader:
            if it >= opts['iters']:
                break
            if it == 0:  # NOTE: codebook from encoder outputs, or all latents pick one code
                restart_codes(torch.arange(model.n_embed), images)
            for opt in (optimizer, disc_opt):
                for group in opt.param_groups if opt is not None else []:
                    group['lr'] = opts['lr'] * lr_at(it)
            recon, vq_loss, codes = model(images)
            loss = recon_fn(recon, images) + vq_loss
            gan_loss = torch.zeros(())
            if disc is not None and it >= opts['gan_start']:
                gan_loss = -disc(recon).mean()
                loss = loss + opts['gan_weight'] * gan_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if ema is not None:
                ema.update(latents['z'], codes)
            if disc is not None and it >= opts['gan_start']:
                d_loss = F.relu(1 - disc(images)).mean() + F.relu(1 + disc(recon.detach())).mean()
                disc_opt.zero_grad(set_to_none=True)
                d_loss.backward()
                disc_opt.step()
            usage += torch.bincount(codes.flatten(), minlength=model.n_embed)
            it += 1
            bar.update(1)
            record = {}
            if opts['dead_code_interval'] and it % opts['dead_code_interval'] == 0:
                dead = (usage == 0).nonzero().flatten()
                if len(dead):
                    restart_codes(dead, images)
                stats = code_stats(usage)
                usage.zero_()
                record.update({'loss': loss.item(), 'vq_loss': vq_loss.item(),
                               'gan_loss': gan_loss.item(), 'dead_codes_reset': int(len(dead)),
                               **{f'window_{k}': v for k, v in stats.items()}})
            if opts['preview_interval'] and it % opts['preview_interval'] == 0:
                # the held-out PSNR as training goes, next to a preview of what it looks like
                stats, recon = evaluate(model, eval_images)
                record.update({f'eval_{k}': v for k, v in stats.items()})
                _preview(eval_images, recon, osp.join(work_dir, 'previews', f'iter_{it:06d}.png'))
            if record:
                with open(log_path, 'a') as f:
                    f.write(json.dumps({'iter': it, **record}) + '\n')
            shown.update(record)
            if it % opts['log_interval'] == 0:
                bar.set_postfix(loss=f'{loss.item():.4f}', vq=f'{vq_loss.item():.4f}',
                                **{k: f'{shown[k]:.4g}' for k in ('eval_psnr', 'eval_used_codes')
                                   if k in shown})
            if it % opts['checkpoint_interval'] == 0 or it == opts['iters']:
                state = {'model': model.state_dict(), 'optimizer': optimizer.state_dict(),
                         'iter': it}
                if disc is not None:
                    state.update(disc=disc.state_dict(), disc_opt=disc_opt.state_dict())
                if ema is not None:
                    state['codebook_ema'] = ema.state_dict()
                _atomic_save(state, state_path)
                _atomic_save(model.state_dict(), osp.join(work_dir, 'tokenizer.pth'))
    bar.close()
    stats, recon = evaluate(model, eval_images)
    result = {'iters': it, 'seconds': round(time.time() - t0, 1), **stats,
              **baselines(eval_images, model.factor)}
    _preview(eval_images, recon, osp.join(work_dir, 'previews', 'final.png'))
    atomic_json(osp.join(work_dir, 'eval.json'), result)
    return result
