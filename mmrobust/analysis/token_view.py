"""What a discrete tokenizer keeps: images decoded from their codes, clean and corrupted.

For each image the tokenizer's reconstruction from codes is shown next to the input (the view a
Dr-ViT or a DAT-trained model gets), for the clean image and each corruption; over all images
and severities it reports the fraction of code positions that a corruption changes (the
invariance of the discrete representation) and the reconstruction PSNR.
"""
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence

import cv2
import numpy as np
import torch
import torch.nn as nn

from ..corruptions import CORRUPTIONS, corrupt, derive_seed
from ..models.tokenizers import VQGAN, VQGAN_ARCHS, quantize_images
from ..utils.errors import InputNotFoundError, UnknownNameError
from ..utils.io import atomic_image, atomic_json, save_figure

__all__ = ['load_tokenizer', 'read_rgb', 'token_view', 'plot_code_changes']


def load_tokenizer(spec: str, checkpoint: Optional[str] = None) -> nn.Module:
    """A frozen VQGAN from an arch name of ``VQGAN_ARCHS`` or a tokenizer config.

    The ``model`` of a ``tools/train_vq.py`` config. With ``checkpoint`` (or the config's
    ``init_cfg``, or the ``work_dirs/<config>/tokenizer.pth`` that ``tools/train_vq.py`` writes by
    default).
    """
    if spec in VQGAN_ARCHS:
        model = VQGAN(arch=spec)
    elif osp.isfile(spec):
        from mmengine.config import Config
        cfg = Config.fromfile(spec)
        model_cfg = cfg.get('model') or {}
        if model_cfg.get('type') == 'VQTokenizerTrainer':  # a tokenizer-training config
            model_cfg = model_cfg['tokenizer']
        if model_cfg.get('type') != 'VQGAN':
            raise ValueError(f'{spec} has no VQGAN `model`; pass a tokenizer config such as '
                             'configs/tokenizers/vq-small-f16_toy-coco.py or an arch name '
                             f'({", ".join(VQGAN_ARCHS)})')
        kwargs = {k: v for k, v in model_cfg.items() if k != 'type'}
        model = VQGAN(**kwargs)
        if checkpoint is None and kwargs.get('init_cfg'):
            model.init_weights()
            checkpoint = kwargs['init_cfg'].get('checkpoint')
        default = osp.join('work_dirs', osp.splitext(osp.basename(spec))[0], 'tokenizer.pth')
        if checkpoint is None and osp.isfile(default):
            checkpoint = default  # what `tools/train_vq.py CONFIG` writes by default
    else:
        raise InputNotFoundError(f'{spec} is neither a VQGAN arch ({", ".join(VQGAN_ARCHS)}) nor '
                                 'a tokenizer config file')
    if checkpoint:
        model.load_checkpoint(checkpoint)
    else:
        raise ValueError('no tokenizer weights: pass --checkpoint (a taming / latent-diffusion '
                         '.ckpt, or the tokenizer.pth that tools/train_vq.py writes; for a '
                         'tokenizer config its default work_dirs/<config>/tokenizer.pth is used '
                         'when it exists)')
    return model.eval().requires_grad_(False)


def read_rgb(path: str, max_size: int = 0) -> np.ndarray:
    """A uint8 RGB image; its longer side resized to ``max_size`` when larger (0: keep)."""
    img = cv2.imread(path, cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError(f'cannot read image {path} (missing, truncated or not an image)')
    h, w = img.shape[:2]
    if max_size and max(h, w) > max_size:
        scale = max_size / max(h, w)
        img = cv2.resize(img, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_AREA)
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float('inf') if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


@torch.no_grad()
def _round_trip(tokenizer: nn.Module, img: np.ndarray):
    x = torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255
    recon, codes = quantize_images(tokenizer, x)
    recon = (recon[0].clamp(0, 1).permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    return recon, codes[0]


def _labelled(img: np.ndarray, text: str) -> np.ndarray:
    out = cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
    cv2.putText(out, text, (4, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 0, 0), 3, cv2.LINE_AA)
    cv2.putText(out, text, (4, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (255, 255, 255), 1,
                cv2.LINE_AA)
    return out


def token_view(tokenizer: nn.Module, images: Dict[str, np.ndarray], out_dir: str,
               corruptions: Sequence[str], severities: Sequence[int] = (1, 2, 3, 4, 5),
               show_severity: int = 3, seed: int = 0, progress: bool = True) -> Dict:
    """Write the token view of each image and return its numbers.

    Writes ``<name>.png`` per image (top: inputs, bottom: reconstructions from codes; clean, then
    each corruption at ``show_severity``) and ``token_view.json``; returns the numbers:
    reconstruction PSNR, the codes changed by each corruption and severity, and the codes changed by
    re-encoding the clean reconstruction (``codes_changed_reencoding``).
    """
    unknown = [c for c in corruptions if c not in CORRUPTIONS]
    if unknown:
        raise UnknownNameError(f'unknown corruptions {unknown}; choose from {sorted(CORRUPTIONS)}')
    os.makedirs(out_dir, exist_ok=True)
    changed: Dict[str, Dict[int, List[float]]] = {c: {s: [] for s in severities}
                                                  for c in corruptions}
    psnr_clean: List[float] = []
    reencoded: List[float] = []
    psnr_corrupted: Dict[str, Dict[int, List[float]]] = {c: {s: [] for s in severities}
                                                         for c in corruptions}
    items = list(images.items())
    if progress:
        from tqdm import tqdm
        items = tqdm(items, desc='token view', unit='img')
    for name, img in items:
        recon, codes = _round_trip(tokenizer, img)
        psnr_clean.append(_psnr(recon, img))
        # NOTE: the tokenizer's own drift, Q(Q(x)) vs Q(x): the floor of what DAT's
        # requantize='reconstruction' changes before any attack
        reencoded.append(float((_round_trip(tokenizer, recon)[1] != codes).float().mean()))
        top, bottom = [_labelled(img, 'clean')], [_labelled(recon, 'from codes')]
        for c in corruptions:
            for s in severities:
                bad = corrupt(img, c, s, seed=derive_seed(seed, name, c, s))
                bad_recon, bad_codes = _round_trip(tokenizer, bad)
                changed[c][s].append(float((bad_codes != codes).float().mean()))
                psnr_corrupted[c][s].append(_psnr(bad_recon, bad))
                if s == show_severity:
                    top.append(_labelled(bad, f'{c} {s}'))
                    bottom.append(_labelled(bad_recon,
                                            f'{100 * changed[c][s][-1]:.0f}% codes changed'))
        grid = np.concatenate([np.concatenate(top, 1), np.concatenate(bottom, 1)], 0)
        atomic_image(osp.join(out_dir, f'{osp.splitext(osp.basename(name))[0]}.png'), grid)
    result = dict(
        images=len(images), seed=seed, severities=list(severities),
        recon_psnr_clean=float(np.mean(psnr_clean)),
        codes_changed_reencoding=float(np.mean(reencoded)),
        codes_changed={c: {str(s): float(np.mean(v)) for s, v in d.items()}
                       for c, d in changed.items()},
        recon_psnr_corrupted={c: {str(s): float(np.mean(v)) for s, v in d.items()}
                              for c, d in psnr_corrupted.items()})
    atomic_json(osp.join(out_dir, 'token_view.json'), result)
    return result


def plot_code_changes(result: Dict, path: str) -> str:
    """Fraction of changed codes against severity, one line per corruption."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (c, per_sev) in enumerate(result['codes_changed'].items()):
        sev = [int(s) for s in per_sev]
        ax.plot(sev, [100 * v for v in per_sev.values()], marker='o', label=c,
                color=plt.cm.tab20(i % 20))
    ax.set_xlabel('severity')
    ax.set_ylabel('codes changed (%)')
    ax.set_title(f"codes changed by each corruption ({result['images']} images)")
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)
