"""Train a VQ tokenizer (VQ-VAE / small VQGAN) on the images of any mmdet / mmseg dataset.

Dr-ViT's stage 1 and the discretizer of DAT. The images come without labels from the dataset of
a detection or segmentation config; the loss is the standard VQ-VAE loss (reconstruction +
``|sg[z] - e|^2 + beta |z - sg[e]|^2``, straight-through), optionally with a PatchGAN term.
Codebook usage is tracked (perplexity, used codes) and dead codes are re-initialised from
encoder outputs. Reconstruction previews and checkpoints are written to the work dir; the
checkpoint is a plain state dict that ``VQGAN(checkpoint=...)`` loads strictly.
"""
import json
import math
import os
import os.path as osp
import random
import time
from typing import Dict, List, Optional

import cv2
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.config import Config

from ..registry import MODELS

# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------


class ImageCrops(torch.utils.data.Dataset):
    """Random (train) or centre (eval) square crops, in [0, 1] RGB, of a dataset's images."""

    def __init__(self, paths: List[str], size: int, train: bool) -> None:
        if not paths:
            raise FileNotFoundError('the dataset has no images')
        self.paths, self.size, self.train = paths, size, train

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> torch.Tensor:
        img = cv2.imread(self.paths[index], cv2.IMREAD_COLOR)
        if img is None:
            raise OSError(f'cannot read image {self.paths[index]}')
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        h, w = img.shape[:2]
        scale = self.size / min(h, w)
        if self.train:  # NOTE: a random zoom in [1, 2] of the shorter side adds scale variety
            scale *= random.uniform(1.0, 2.0)
        img = cv2.resize(img, (max(self.size, round(w * scale)), max(self.size, round(h * scale))),
                         interpolation=cv2.INTER_AREA)
        h, w = img.shape[:2]
        top = random.randint(0, h - self.size) if self.train else (h - self.size) // 2
        left = random.randint(0, w - self.size) if self.train else (w - self.size) // 2
        img = img[top:top + self.size, left:left + self.size]
        if self.train and random.random() < 0.5:
            img = img[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float() / 255


def dataset_image_paths(config: str, loader: str) -> List[str]:
    """Paths of the images of ``loader``'s dataset in an mmdet/mmseg config (no labels read)."""
    from mmengine.registry import init_default_scope

    import mmrobust  # noqa: F401
    from ..utils import check_dataset_paths, config_scope
    cfg = Config.fromfile(config)
    scope = config_scope(cfg)
    check_dataset_paths(cfg, [loader])
    init_default_scope(scope)
    registry = __import__(f'{scope}.registry', fromlist=['DATASETS']).DATASETS
    dataset_cfg = cfg[loader]['dataset']
    dataset_cfg = dict(dataset_cfg, pipeline=[])
    dataset_cfg.pop('filter_cfg', None)
    dataset = registry.build(dataset_cfg)
    return [dataset.get_data_info(i)['img_path'] for i in range(len(dataset))]


# ----------------------------------------------------------------------------------------------
# losses and statistics
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------

DEFAULTS = dict(iters=1000, batch_size=8, crop_size=128, lr=2e-4, weight_decay=0.0,
                num_workers=2, recon_loss='l1', gan_weight=0.0, gan_start=0,
                dead_code_interval=100, log_interval=20, preview_interval=200,
                checkpoint_interval=500, eval_images=16, seed=0)


def _atomic_save(obj, path: str) -> None:
    tmp = f'{path}.tmp-{os.getpid()}'
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _preview(originals: torch.Tensor, recons: torch.Tensor, path: str) -> None:
    """A PNG with originals (top row) above their reconstructions (bottom row)."""
    top = torch.cat(list(originals[:8]), dim=2)
    bottom = torch.cat(list(recons[:8].clamp(0, 1)), dim=2)
    grid = (torch.cat([top, bottom], dim=1).permute(1, 2, 0).numpy() * 255).round()
    tmp = path + '.tmp.png'
    cv2.imwrite(tmp, cv2.cvtColor(grid.astype(np.uint8), cv2.COLOR_RGB2BGR))
    os.replace(tmp, path)


@torch.no_grad()
def evaluate(model, images: torch.Tensor) -> Dict[str, float]:
    model.eval()
    codes = model.encode(images)
    recon = model.decode(codes)
    counts = torch.bincount(codes.flatten(), minlength=model.n_embed)
    model.train()
    return {'psnr': psnr(recon, images), **code_stats(counts), **baselines(images, model.factor)}


def train_vq(cfg: Config, work_dir: str, resume: bool = False) -> Dict[str, float]:
    """Train the tokenizer of ``cfg`` (keys: ``model``, ``data``, ``train``); returns the final
    evaluation (PSNR, perplexity, used codes, baselines), also written to the work dir."""
    opts = dict(DEFAULTS, **cfg.get('train', {}))
    unknown = set(cfg.get('train', {})) - set(DEFAULTS)
    if unknown:
        raise KeyError(f'unknown train options {sorted(unknown)}; valid: {sorted(DEFAULTS)}')
    random.seed(opts['seed'])
    torch.manual_seed(opts['seed'])
    os.makedirs(osp.join(work_dir, 'previews'), exist_ok=True)
    data = cfg['data']
    train_set = ImageCrops(dataset_image_paths(data['config'], data.get('train', 'train_dataloader')),
                           opts['crop_size'], train=True)
    eval_paths = dataset_image_paths(data['config'], data.get('val', 'val_dataloader'))
    eval_set = ImageCrops(eval_paths[:opts['eval_images']], opts['crop_size'], train=False)
    eval_images = torch.stack([eval_set[i] for i in range(len(eval_set))])

    model = MODELS.build(cfg['model']).train()
    if opts['crop_size'] % model.factor:
        raise ValueError(f"crop_size {opts['crop_size']} must be a multiple of {model.factor}")
    optimizer = torch.optim.Adam(model.parameters(), lr=opts['lr'], betas=(0.5, 0.9),
                                 weight_decay=opts['weight_decay'])
    disc = disc_opt = None
    if opts['gan_weight'] > 0:
        disc = PatchDiscriminator()
        disc_opt = torch.optim.Adam(disc.parameters(), lr=opts['lr'], betas=(0.5, 0.9))
    state_path = osp.join(work_dir, 'latest_state.pth')
    start = 0
    if resume and osp.isfile(state_path):
        from ..utils import safe_load
        state = safe_load(state_path)
        model.load_state_dict(state['model'])
        optimizer.load_state_dict(state['optimizer'])
        if disc is not None and 'disc' in state:
            disc.load_state_dict(state['disc'])
            disc_opt.load_state_dict(state['disc_opt'])
        start = int(state['iter'])

    loader = torch.utils.data.DataLoader(
        train_set, batch_size=opts['batch_size'], shuffle=True, drop_last=True,
        num_workers=opts['num_workers'], persistent_workers=opts['num_workers'] > 0)
    recon_fn = F.l1_loss if opts['recon_loss'] == 'l1' else F.mse_loss
    usage = torch.zeros(model.n_embed, dtype=torch.long)
    log_path = osp.join(work_dir, 'log.jsonl')
    from tqdm import tqdm
    bar = tqdm(total=opts['iters'], initial=start, unit='it', desc='train_vq', dynamic_ncols=True)
    it, t0 = start, time.time()
    while it < opts['iters']:
        for images in loader:
            if it >= opts['iters']:
                break
            if it == 0:  # NOTE: codebook from encoder outputs, or all latents pick one code
                with torch.no_grad():
                    z = model.encode_latent(images).permute(0, 2, 3, 1).reshape(-1, model.embed_dim)
                    pick = z[torch.randint(len(z), (model.n_embed, ))]
                    model.quantize.embedding.weight.copy_(pick + 1e-3 * torch.randn_like(pick))
            recon, vq_loss, codes = model(images)
            loss = recon_fn(recon, images) + vq_loss
            gan_loss = torch.zeros(())
            if disc is not None and it >= opts['gan_start']:
                gan_loss = -disc(recon).mean()
                loss = loss + opts['gan_weight'] * gan_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if disc is not None and it >= opts['gan_start']:
                d_loss = F.relu(1 - disc(images)).mean() + F.relu(1 + disc(recon.detach())).mean()
                disc_opt.zero_grad(set_to_none=True)
                d_loss.backward()
                disc_opt.step()
            usage += torch.bincount(codes.flatten(), minlength=model.n_embed)
            it += 1
            bar.update(1)
            if opts['dead_code_interval'] and it % opts['dead_code_interval'] == 0:
                dead = (usage == 0).nonzero().flatten()
                if len(dead):  # NOTE: restart unused codes at current encoder outputs
                    with torch.no_grad():
                        z = model.encode_latent(images).permute(0, 2, 3, 1).reshape(
                            -1, model.embed_dim)
                        pick = z[torch.randint(len(z), (len(dead), ))]
                        model.quantize.embedding.weight[dead] = pick + 1e-3 * torch.randn_like(pick)
                stats = code_stats(usage)
                usage.zero_()
                record = {'iter': it, 'loss': loss.item(), 'vq_loss': vq_loss.item(),
                          'gan_loss': gan_loss.item(), 'dead_codes_reset': int(len(dead)),
                          **{f'window_{k}': v for k, v in stats.items()}}
                with open(log_path, 'a') as f:
                    f.write(json.dumps(record) + '\n')
            if it % opts['log_interval'] == 0:
                bar.set_postfix(loss=f'{loss.item():.4f}', vq=f'{vq_loss.item():.4f}')
            if opts['preview_interval'] and it % opts['preview_interval'] == 0:
                with torch.no_grad():
                    model.eval()
                    _preview(eval_images, model.reconstruct(eval_images[:8]),
                             osp.join(work_dir, 'previews', f'iter_{it:06d}.png'))
                    model.train()
            if it % opts['checkpoint_interval'] == 0 or it == opts['iters']:
                state = {'model': model.state_dict(), 'optimizer': optimizer.state_dict(),
                         'iter': it}
                if disc is not None:
                    state.update(disc=disc.state_dict(), disc_opt=disc_opt.state_dict())
                _atomic_save(state, state_path)
                _atomic_save(model.state_dict(), osp.join(work_dir, 'tokenizer.pth'))
    bar.close()
    result = {'iters': it, 'seconds': round(time.time() - t0, 1), **evaluate(model, eval_images)}
    with torch.no_grad():
        model.eval()
        _preview(eval_images, model.reconstruct(eval_images[:8]),
                 osp.join(work_dir, 'previews', 'final.png'))
    tmp = osp.join(work_dir, 'eval.json.tmp')
    with open(tmp, 'w') as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, osp.join(work_dir, 'eval.json'))
    return result
