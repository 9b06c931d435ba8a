"""The files a trained tokenizer's users read, written into the work dir."""
import os.path as osp
import re
import time
from typing import Dict, Optional

import cv2
import numpy as np
import torch
from mmengine.hooks import Hook
from typing_extensions import override

from ...models.utils import unwrap_model
from ...registry import HOOKS
from ...utils.io import atomic_image, atomic_json, atomic_write

__all__ = ['TokenizerExportHook']


def _preview(originals: torch.Tensor, recons: torch.Tensor, path: str) -> None:
    """A PNG with originals (top row) above their reconstructions (bottom row)."""
    top = torch.cat(list(originals), dim=2)
    bottom = torch.cat(list(recons.clamp(0, 1)), dim=2)
    grid = (torch.cat([top, bottom], dim=1).permute(1, 2, 0).numpy() * 255).round()
    atomic_image(path, cv2.cvtColor(grid.astype(np.uint8), cv2.COLOR_RGB2BGR))


@HOOKS.register_module()
class TokenizerExportHook(Hook):
    """Writes what tokenizer users read into the work dir.

    A reconstruction preview after each validation (``previews/iter_<n>.png``), and at the end of
    training ``tokenizer.pth`` (the VQGAN's plain state dict, what ``VQGAN(checkpoint=...)``, the
    DAT hook and Dr-ViT load) and ``eval.json`` (the last validation's metrics, the iterations and
    the time).
    """

    priority = 'LOW'

    def __init__(self) -> None:
        self.last_metrics: Dict[str, float] = {}
        self.start = 0.0

    @override
    def before_train(self, runner) -> None:
        self.start = time.time()

    @override
    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        # NOTE: in DDP the trainer's parts are wrapped one by one (MMSeparateDistributed-
        # DataParallel), which puts `module.` inside the keys; saved without it, a checkpoint is
        # the same whatever the process count (mmengine's loading unwraps likewise)
        checkpoint['state_dict'] = type(checkpoint['state_dict'])(
            (re.sub(r'^(tokenizer|loss)\.module\.', r'\1.', k), v)
            for k, v in checkpoint['state_dict'].items())

    @override
    def after_val_epoch(self, runner, metrics: Optional[Dict[str, float]] = None) -> None:
        self.last_metrics = {k.split('/')[-1]: v for k, v in (metrics or {}).items()}
        model = unwrap_model(runner.model)
        preview = getattr(model, 'last_preview', None)
        if runner.rank == 0 and preview is not None:
            _preview(*preview, osp.join(runner.work_dir, 'previews', f'iter_{runner.iter:06d}.png'))

    @override
    def after_train(self, runner) -> None:
        if runner.rank != 0:
            return
        model = unwrap_model(runner.model)
        with atomic_write(osp.join(runner.work_dir, 'tokenizer.pth'), 'wb') as f:
            torch.save(model.vqgan.state_dict(), f)
        atomic_json(osp.join(runner.work_dir, 'eval.json'),
                    {'iters': runner.iter, 'seconds': round(time.time() - self.start, 1),
                     **self.last_metrics})
        runner.logger.info(f'tokenizer: {osp.join(runner.work_dir, "tokenizer.pth")} '
                           f'(held-out {self.last_metrics})')
