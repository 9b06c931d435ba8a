"""Held-out reconstruction quality of a VQ tokenizer as an mmengine metric."""
from typing import Dict, Optional, Sequence

import torch
from mmengine.evaluator import BaseMetric
from typing_extensions import override

from ..models.tokenizers.trainer import code_stats, psnr
from ..registry import METRICS

__all__ = ['VQReconstructionMetric']


@METRICS.register_module()
class VQReconstructionMetric(BaseMetric):
    """Held-out PSNR of the reconstructions and of two baselines, and the codebook's use.

    The PSNR is over all values of all images, as one MSE; the baselines are ``psnr_mean_image``
    and ``psnr_blur``; the codebook's perplexity and used codes are over the held-out codes.
    """

    default_prefix = 'vq'

    def __init__(self, n_embed: Optional[int] = None, collect_device: str = 'cpu',
                 prefix: Optional[str] = None) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix)
        self.n_embed = n_embed

    @override
    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        self.results.extend(data_samples)

    @override
    def compute_metrics(self, results: list) -> Dict[str, float]:
        count = sum(r['values'] for r in results)
        codes = torch.cat([r['codes'] for r in results])
        hist = torch.bincount(codes, minlength=self.n_embed or int(codes.max()) + 1)
        out = {'psnr': psnr(sum(r['sq_err_recon'] for r in results), count),
               'psnr_mean_image': psnr(sum(r['sq_err_mean_image'] for r in results), count),
               'psnr_blur': psnr(sum(r['sq_err_blur'] for r in results), count)}
        out.update({k: float(v) for k, v in code_stats(hist).items()})
        return out
