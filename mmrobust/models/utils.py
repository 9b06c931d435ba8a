"""Strict loading of foreign checkpoints into mmrobust models.

Every backbone converts a foreign checkpoint with its own pure `checkpoint_filter_fn` and then
loads it here, strictly: a missing or unexpected key is an error that lists the keys, never a
warning that scrolls by.
"""
import os.path as osp
from typing import Callable, Dict, Iterable, Optional

import torch
import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.runner.checkpoint import CheckpointLoader

__all__ = ['CheckpointMismatchError', 'unwrap_state_dict', 'load_state_dict_strict',
           'load_pretrained']

_WRAPPERS = ('state_dict', 'model', 'state_dict_ema', 'model_ema')


class CheckpointMismatchError(RuntimeError):
    """A checkpoint does not fit the model it is loaded into."""


def unwrap_state_dict(checkpoint: dict, strip_prefixes: Iterable[str] = ('module.',)) -> Dict:
    """The weights of a checkpoint: unwrapped (`state_dict` / `model` / `state_dict_ema`, in
    that order) and without DDP `module.` prefixes."""
    state = checkpoint
    for key in _WRAPPERS:
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointMismatchError(
            'the checkpoint holds no state dict (a dict of tensors, possibly under one of '
            f'{_WRAPPERS}); top-level keys: {sorted(checkpoint)[:20] if isinstance(checkpoint, dict) else type(checkpoint)}')
    for prefix in strip_prefixes:
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
    return dict(state)


def _list(keys, limit: int = 40) -> str:
    keys = sorted(keys)
    more = f' ... and {len(keys) - limit} more' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def load_state_dict_strict(model: nn.Module, state_dict: Dict[str, torch.Tensor],
                           allowed_missing: Iterable[str] = (), source: str = 'checkpoint') -> None:
    """Load `state_dict` into `model`; every key must match in name and shape.

    Args:
        model: The module to fill.
        state_dict: Converted weights.
        allowed_missing: Prefixes of model keys the checkpoint may lack (newly added layers,
            which keep their initialisation).
        source: Name of the checkpoint for the error message.

    Raises:
        CheckpointMismatchError: listing missing, unexpected and mis-shaped keys.
    """
    own = model.state_dict()
    allowed = tuple(allowed_missing)
    missing = [k for k in own if k not in state_dict and not k.startswith(allowed)]
    unexpected = [k for k in state_dict if k not in own]
    shapes = [f'{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}'
              for k in state_dict if k in own and state_dict[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        parts = [f'{source} does not match {type(model).__name__}'
                 f'{"(" + model.arch_name + ")" if hasattr(model, "arch_name") else ""}:']
        if missing:
            parts.append(f'missing keys ({len(missing)}): {_list(missing)}')
        if unexpected:
            parts.append(f'unexpected keys ({len(unexpected)}): {_list(unexpected)}')
        if shapes:
            parts.append(f'shape mismatches ({len(shapes)}): {_list(shapes, 10)}')
        parts.append('Is it a checkpoint of another architecture or variant? Check `arch` and '
                     'the file.')
        raise CheckpointMismatchError(' '.join(parts))
    model.load_state_dict(state_dict, strict=False)  # NOTE: allowed missing keys are the only gap


def load_pretrained(model: nn.Module, checkpoint: str,
                    filter_fn: Callable[[Dict, nn.Module], Dict],
                    allowed_missing: Iterable[str] = (),
                    logger: Optional[MMLogger] = None) -> None:
    """Load a (foreign) checkpoint file through `filter_fn` and :func:`load_state_dict_strict`."""
    if '://' not in checkpoint and not osp.isfile(osp.expanduser(checkpoint)):
        raise FileNotFoundError(
            f'{type(model).__name__}: pretrained checkpoint {checkpoint!r} not found (resolved '
            f'from {osp.abspath(".")}). mmrobust never downloads weights: put the file there '
            '(e.g. from the official release), point init_cfg.checkpoint at it, or train from '
            'scratch with `--cfg-options model.backbone.init_cfg=None`.')
    raw = CheckpointLoader.load_checkpoint(checkpoint, map_location='cpu')
    state = filter_fn(raw, model)
    load_state_dict_strict(model, state, allowed_missing, source=f'checkpoint {checkpoint}')
    (logger or MMLogger.get_current_instance()).info(
        f'{type(model).__name__}: loaded all {len(state)} tensors from {checkpoint}'
        + (f' (newly initialised: {", ".join(allowed_missing)})' if allowed_missing else ''))
