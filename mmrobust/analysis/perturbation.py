"""Fourier sensitivity heatmaps and patch-masking curves for detectors and segmentors.

Yin et al., "A Fourier-Perspective on Model Robustness in Computer Vision" (NeurIPS 2019) and
Paul & Chen, "Vision Transformers are Robust Learners" (AAAI 2022). The perturbation is applied
to the batch the model sees, after its data preprocessor (the same pixel-space mapping as
:class:`mmrobust.engine.DATHook`), on each image's own area (padding excluded), and the task
score is the config's own test metric (box AP, mIoU) on a fixed image subset.
"""
import copy
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn

from ..models.data_preprocessors import PixelSpace, patched_forward, perturb_in_pixels
from ..utils import ResultsStore, leaf_datasets, save_figure
from ..utils.errors import UnknownNameError

__all__ = ['fourier_basis', 'frequency_grid', 'fourier_perturb', 'patch_mask',
           'perturbed_preprocessor', 'PerturbationStudy', 'mirror_heatmap', 'open_study',
           'heatmap_matrix', 'plot_heatmaps', 'plot_masking']

Perturb = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


# -- perturbations ---------------------------------------------------------------------------------

def fourier_basis(h: int, w: int, u: int, v: int) -> torch.Tensor:
    """The real 2D Fourier basis image of frequency (u, v) (cycles per image), unit L2 norm.

    It is the inverse FFT of a Hermitian pair of unit spikes at (u, v) and (-u, -v), so
    (u, v) and (-u, -v) give the same image.
    """
    spec = torch.zeros(h, w, dtype=torch.complex128)
    spec[u % h, v % w] = 1
    spec[-u % h, -v % w] = 1
    basis = torch.fft.ifft2(spec).real
    return (basis / basis.norm()).float()


def frequency_grid(size: int) -> List[Tuple[int, int]]:
    """The half of a centred ``size`` x ``size`` frequency grid that determines the whole heatmap.

    (u, v) and (-u, -v) share one basis image. U > 0, or u == 0 and v >= 0.
    """
    if size < 1 or size % 2 == 0:
        raise ValueError(f'the frequency grid size must be odd and positive, got {size}')
    r = size // 2
    return [(u, v) for u in range(0, r + 1) for v in range(-r, r + 1) if u > 0 or v >= 0]


def mirror_heatmap(values: Dict[Tuple[int, int], float], size: int) -> np.ndarray:
    """The full centred heatmap (row u + r, column v + r) from its half."""
    r = size // 2
    out = np.full((size, size), np.nan)
    for (u, v), value in values.items():
        out[u + r, v + r] = value
        out[-u + r, -v + r] = value
    return out


def fourier_perturb(pixels: torch.Tensor, mask: torch.Tensor, u: int, v: int, eps: float,
                    generator: torch.Generator) -> torch.Tensor:
    """pixels + eps · r_c · U_(u,v) on each image's area (r_c = ±1 per channel), clipped."""
    out = pixels.clone()
    for i in range(pixels.shape[0]):
        rows, cols = mask[i, 0].any(1).sum().item(), mask[i, 0].any(0).sum().item()
        basis = fourier_basis(rows, cols, u, v).to(pixels.device)
        signs = torch.randint(0, 2, (pixels.shape[1], 1, 1), generator=generator) * 2 - 1
        out[i, :, :rows, :cols] += eps * signs.to(pixels.device) * basis
    return out.clamp(0, 1)


def patch_mask(pixels: torch.Tensor, mask: torch.Tensor, patch: int, ratio: float,
               generator: torch.Generator, fill: torch.Tensor) -> Tuple[torch.Tensor, List[int]]:
    """Replace exactly round(ratio · n) of each image's n patches with ``fill``.

    The patches are a grid of ``patch`` px over the image's area; ``fill`` is per channel.
    Returns the images and the masked counts.
    """
    if not 0 <= ratio <= 1:
        raise ValueError(f'masking ratios must be in [0, 1], got {ratio}')
    out, counts = pixels.clone(), []
    for i in range(pixels.shape[0]):
        rows, cols = mask[i, 0].any(1).sum().item(), mask[i, 0].any(0).sum().item()
        gh, gw = -(-rows // patch), -(-cols // patch)
        k = int(round(ratio * gh * gw))
        chosen = torch.randperm(gh * gw, generator=generator)[:k]
        for idx in chosen.tolist():
            r, c = divmod(idx, gw)
            out[i, :, r * patch:min((r + 1) * patch, rows), c * patch:min((c + 1) * patch, cols)] \
                = fill.view(-1, 1, 1)
        counts.append(k)
    return out, counts


@contextmanager
def perturbed_preprocessor(model: nn.Module, perturb: Perturb) -> Iterator[None]:
    """Apply ``perturb(pixels, mask, batch_index)`` ([0, 1] RGB) to every test batch."""
    pre = model.data_preprocessor
    space = PixelSpace(pre).to(next(model.parameters()).device)
    calls = [0]

    def transform(out: dict, training: bool) -> dict:
        out = perturb_in_pixels(space, out, lambda p, m: perturb(p, m, calls[0]))
        calls[0] += 1
        return out

    with patched_forward(pre, transform):
        yield


# -- studies ---------------------------------------------------------------------------------------

class PerturbationStudy:
    """Evaluates a built, loaded runner under perturbations on a fixed subset of test images.

    Recording each setting's metrics in a JSON file (atomic, resumable).
    """

    def __init__(self, runner, cfg, results_path: str, identity: Dict, num_images: int = 0,
                 seed: int = 0) -> None:
        self.runner, self.cfg, self.seed = runner, cfg, seed
        self.loader = copy.deepcopy(cfg.test_dataloader)
        if num_images:
            for leaf in leaf_datasets(self.loader['dataset']):
                leaf['indices'] = num_images  # NOTE: mmengine's BaseDataset keeps the first N
        self.store = ResultsStore(results_path, dict(identity, num_images=num_images, seed=seed),
                                  entries_key='settings', identity_key='identity',
                                  fix='it was written by another study; pass another '
                                  '--out-dir or delete it')
        self.data = self.store.data

    def done(self, key: str) -> bool:
        """Whether the setting ``key`` is recorded already."""
        return self.store.done(key)

    def evaluate(self, key: str, perturb: Optional[Perturb]) -> Dict[str, float]:
        """The metrics under ``perturb`` (None: clean), cached under ``key``."""
        from mmengine.runner import TestLoop
        if self.done(key):
            return self.data['settings'][key]
        loop = TestLoop(self.runner, self.loader, copy.deepcopy(self.cfg.test_evaluator))
        dataset = loop.dataloader.dataset
        ids = [dataset.get_data_info(i).get('img_id') for i in range(len(dataset))]
        for metric in loop.evaluator.metrics:
            # NOTE: COCO metrics otherwise score every image of the annotation file, so a subset
            # would count the images it skipped as missed detections
            if hasattr(metric, 'img_ids') and None not in ids:
                metric.img_ids = ids
        model = self.runner.model
        model = getattr(model, 'module', model)
        if perturb is None:
            metrics = loop.run()
        else:
            with perturbed_preprocessor(model, perturb):
                metrics = loop.run()
        metrics = {k: float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float, np.floating))}
        if not metrics and self.done('clean'):
            # NOTE: mmdet's CocoMetric returns nothing when no image has a detection: score 0
            metrics = {k: 0.0 for k in self.data['settings']['clean']}
        self.store.record(key, value=metrics)
        return metrics

    def generator(self, key: str) -> torch.Generator:
        """The setting ``key``'s own generator, from the study's seed and the key."""
        state = np.random.SeedSequence([self.seed, *key.encode()]).generate_state(1)[0]
        return torch.Generator().manual_seed(int(state))

    def fourier(self, size: int, eps: float, progress: bool = True) -> Dict:
        """The Fourier heatmap study: each frequency of a ``size`` grid at ``eps``."""
        from tqdm import tqdm
        clean = self.evaluate('clean', None)
        freqs = frequency_grid(size)
        for u, v in tqdm(freqs, desc='fourier', unit='freq', disable=not progress):
            key = f'fourier:{u},{v}'
            gen = self.generator(key)
            self.evaluate(key, lambda p, m, _b, u=u, v=v, g=gen: fourier_perturb(p, m, u, v,
                                                                                 eps, g))
        return clean

    def masking(self, ratios: Sequence[float], patch: int, progress: bool = True) -> Dict:
        """The patch-masking study: each ratio of ``patch`` px patches masked."""
        from tqdm import tqdm
        pre = getattr(self.runner.model, 'module', self.runner.model).data_preprocessor
        space = PixelSpace(pre)
        # the dataset mean colour: zero after normalisation
        fill = space.to_pixels(torch.zeros(1, 3, 1, 1)).view(3)
        for ratio in tqdm(ratios, desc='masking', unit='ratio', disable=not progress):
            key = f'mask:{ratio:g}'
            gen = self.generator(key)
            self.evaluate(key, lambda p, m, _b, r=ratio, g=gen: patch_mask(p, m, patch, r, g,
                                                                           fill.to(p))[0])
        return self.data['settings']


# -- set-up and figures ----------------------------------------------------------------------------

PREFERRED_METRICS = ('coco/bbox_mAP', 'coco/segm_mAP', 'mIoU', 'aAcc')


def open_study(config: str, checkpoint: str, results_path: str, identity: Dict,
               num_images: int = 0, seed: int = 0, cfg_options: Optional[Dict] = None,
               work_dir: Optional[str] = None,
               allow_partial_load: bool = False) -> 'PerturbationStudy':
    """Build the config's model and test loader.

    Load ``checkpoint`` once (strictly unless ``allow_partial_load``), open the results.
    """
    from mmengine.config import Config

    from ..apis import apply_common_args, apply_test_args, build_runner
    from ..evaluation.results import file_sha256
    from ..evaluation.robustness import config_sha256
    cfg = Config.fromfile(config)
    cfg = apply_common_args(cfg, config, 'none', work_dir, cfg_options)
    cfg = apply_test_args(cfg, checkpoint)
    runner = build_runner(cfg, ('test_dataloader',), allow_partial_load)
    runner.call_hook('before_run')
    runner.load_or_resume()
    identity = dict(identity, config=config, config_sha256=config_sha256(cfg),
                    checkpoint_sha256=file_sha256(checkpoint))
    return PerturbationStudy(runner, cfg, results_path, identity, num_images, seed)


def main_metric(settings: Dict[str, Dict[str, float]], metric: Optional[str] = None) -> str:
    keys = next(iter(settings.values())).keys() if settings else []
    if metric:
        if metric not in keys:
            raise UnknownNameError(f'metric {metric!r} not in the results; available: '
                                   f'{sorted(keys)}')
        return metric
    return next((k for k in PREFERRED_METRICS if k in keys), next(iter(keys), ''))


def heatmap_matrix(data: Dict, metric: Optional[str] = None) -> np.ndarray:
    """The full (grid × grid) matrix of ``metric``'s drop from clean of a Fourier study's results.

    Row u + grid // 2, column v + grid // 2. NaN where a setting was not evaluated yet.
    """
    settings = data['settings']
    key = main_metric(settings, metric)
    drops = {tuple(int(t) for t in k.split(':')[1].split(',')): settings['clean'][key] - m[key]
             for k, m in settings.items() if k.startswith('fourier:')}
    return mirror_heatmap(drops, data['identity']['grid'])


def plot_heatmaps(results: Dict[str, Dict], path: str, metric: Optional[str] = None) -> str:
    """One heatmap per model (label → results JSON): the drop of ``metric`` from clean."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.8), squeeze=False)
    for ax, (label, data) in zip(axes[0], results.items()):
        settings = data['settings']
        key = main_metric(settings, metric)
        r = data['identity']['grid'] // 2
        im = ax.imshow(heatmap_matrix(data, key), cmap='jet',
                       extent=(-r - .5, r + .5, r + .5, -r - .5))
        ax.set_title(f'{label}\n{key} drop (clean {settings["clean"][key]:.3f})', fontsize=9)
        ax.set_xlabel('v (cycles / image)')
        ax.set_ylabel('u (cycles / image)')
        fig.colorbar(im, ax=ax, fraction=0.046)
    return save_figure(fig, path)


def plot_masking(results: Dict[str, Dict], path: str, metric: Optional[str] = None) -> str:
    """Score against the masked fraction, one line per model."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, (label, data) in enumerate(results.items()):
        settings = data['settings']
        key = main_metric(settings, metric)
        points = sorted((float(k.split(':')[1]), m[key]) for k, m in settings.items()
                        if k.startswith('mask:'))
        ax.plot([p[0] for p in points], [p[1] for p in points], marker='o', color=f'C{i}',
                label=f'{label} ({key})')
    ax.set_xlabel(f'fraction of patches masked ({data["identity"]["patch"]} px)')
    ax.set_ylabel('score')
    ax.set_title('patch masking')
    ax.legend(fontsize=8)
    return save_figure(fig, path)
