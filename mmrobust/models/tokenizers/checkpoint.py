"""Tokenizer checkpoints: plain state dicts, mmengine checkpoints and PyTorch-Lightning ``.ckpt``
files (taming / latent-diffusion), the last through the restricted loader of
:func:`mmrobust.utils.checkpoint.load_lightning_checkpoint` (no code from the file runs).
"""
from typing import Dict

import torch

from ...utils.checkpoint import UnsafeCheckpointError, load_lightning_checkpoint, safe_load
from ..utils import unwrap_state_dict


def load_tokenizer_checkpoint(path: str) -> Dict[str, torch.Tensor]:
    """The state dict of a tokenizer checkpoint: plain, mmengine-wrapped or Lightning ``.ckpt``."""
    try:
        raw = safe_load(path, map_location='cpu')
    except UnsafeCheckpointError:
        raw = load_lightning_checkpoint(path)
    return unwrap_state_dict(raw, strip_prefixes=())
