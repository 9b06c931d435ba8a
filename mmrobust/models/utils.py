"""Strict loading of foreign checkpoints into mmrobust models.

Every backbone converts a foreign checkpoint with its own pure `checkpoint_filter_fn` and then
loads it here, strictly: a missing or unexpected key is an error that lists the keys, never a
warning that scrolls by.
"""
import os.path as osp
from typing import Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Type, Union

import torch
import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.model.weight_init import update_init_info
from mmengine.registry import WEIGHT_INITIALIZERS
from mmengine.runner.checkpoint import CheckpointLoader
from torch.nn.modules.batchnorm import _BatchNorm

from ..utils.errors import InputNotFoundError, MMRobustError, UnknownNameError

__all__ = ['CheckpointMismatchError', 'unwrap_state_dict', 'state_dict_mismatch',
           'mismatch_message', 'load_state_dict_strict', 'dropped_summary',
           'load_pretrained', 'StrictPretrainedInit', 'resolve_arch', 'init_trunc_normal_']

_WRAPPERS = ('state_dict', 'model', 'state_dict_ema', 'model_ema')


class CheckpointMismatchError(MMRobustError, RuntimeError):
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
            f'{_WRAPPERS}); top-level keys: '
            f'{sorted(checkpoint)[:20] if isinstance(checkpoint, dict) else type(checkpoint)}')
    for prefix in strip_prefixes:
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
    return dict(state)


def _list(keys, limit: int = 40) -> str:
    keys = sorted(keys)
    more = f' ... and {len(keys) - limit} more' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def state_dict_mismatch(own: Mapping[str, torch.Tensor], state_dict: Mapping[str, torch.Tensor],
                        allowed_missing: Iterable[str] = ()) -> Tuple[list, list, list]:
    """``(missing, unexpected, mis-shaped)`` keys of ``state_dict`` against a model's ``own``
    state dict; model keys starting with a prefix in ``allowed_missing`` may be absent."""
    allowed = tuple(allowed_missing)
    missing = [k for k in own if k not in state_dict and not k.startswith(allowed)]
    unexpected = [k for k in state_dict if k not in own]
    shapes = [f'{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}'
              for k in state_dict if k in own and hasattr(state_dict[k], 'shape')
              and state_dict[k].shape != own[k].shape]
    return missing, unexpected, shapes


def mismatch_message(header: str, missing: Sequence[str], unexpected: Sequence[str],
                     shapes: Sequence[str]) -> str:
    """``header`` followed by the counted, sorted key lists (long lists are cut)."""
    parts = [header]
    if missing:
        parts.append(f'missing keys ({len(missing)}): {_list(missing)}')
    if unexpected:
        parts.append(f'unexpected keys ({len(unexpected)}): {_list(unexpected)}')
    if shapes:
        parts.append(f'shape mismatches ({len(shapes)}): {_list(shapes, 10)}')
    return ' '.join(parts)


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
    missing, unexpected, shapes = state_dict_mismatch(model.state_dict(), state_dict,
                                                      allowed_missing)
    if missing or unexpected or shapes:
        header = (f'{source} does not match {type(model).__name__}'
                  f'{"(" + model.arch_name + ")" if hasattr(model, "arch_name") else ""}:')
        raise CheckpointMismatchError(
            mismatch_message(header, missing, unexpected, shapes)
            + ' Is it a checkpoint of another architecture or variant? Check `arch` and the '
            'file.')
    model.load_state_dict(state_dict, strict=False)  # NOTE: allowed missing keys are the only gap


def dropped_summary(dropped: Mapping[str, str], limit: int = 12) -> str:
    """``dropped`` (checkpoint key -> reason) as one line per reason, e.g.
    ``dropped 2 keys: head.bias, head.weight (ImageNet classifier ...)``; '' when empty."""
    by_reason: Dict[str, list] = {}
    for key, reason in dropped.items():
        by_reason.setdefault(reason, []).append(key)
    return '\n'.join(f'dropped {len(keys)} key{"s" if len(keys) > 1 else ""}: '
                     f'{_list(keys, limit)} ({reason})' for reason, keys in by_reason.items())


def load_pretrained(model: nn.Module, checkpoint: str,
                    filter_fn: Callable[[Dict, nn.Module, Dict[str, str]], Dict],
                    allowed_missing: Iterable[str] = (),
                    logger: Optional[MMLogger] = None) -> None:
    """Load a (foreign) checkpoint file through `filter_fn` and :func:`load_state_dict_strict`.

    ``filter_fn(checkpoint, model, dropped)`` converts the file's content and records every key
    it leaves out in ``dropped`` (key -> reason); those are logged with the loaded count.
    """
    if '://' not in checkpoint and not osp.isfile(osp.expanduser(checkpoint)):
        raise InputNotFoundError(
            f'{type(model).__name__}: pretrained checkpoint {checkpoint!r} not found (resolved '
            f'from {osp.abspath(".")}). mmrobust never downloads weights: put the file there '
            '(where each config\'s file comes from and how to convert it: '
            'docs/en/user_guides/checkpoints.md, "Where each config\'s weights come from"), '
            'point init_cfg.checkpoint at it, or train '
            'from scratch with `--cfg-options model.backbone.init_cfg=None`.')
    raw = CheckpointLoader.load_checkpoint(checkpoint, map_location='cpu')
    dropped: Dict[str, str] = {}
    state = filter_fn(raw, model, dropped)
    load_state_dict_strict(model, state, allowed_missing, source=f'checkpoint {checkpoint}')
    (logger or MMLogger.get_current_instance()).info(
        f'{type(model).__name__}: loaded all {len(state)} tensors from {checkpoint}'
        + (f' (newly initialised: {", ".join(allowed_missing)})' if allowed_missing else '')
        + (f'\n{dropped_summary(dropped)}' if dropped else ''))


def resolve_arch(arch: Union[str, Mapping], zoo: Mapping[str, Mapping], family: str,
                 optional: Sequence[str] = ()) -> Tuple[str, dict]:
    """``(name, settings)`` of a variant: a name of ``zoo`` or a custom dict with the zoo's keys
    (plus any of ``optional``); anything else is an error that lists the choices."""
    keys = sorted(next(iter(zoo.values())))
    if isinstance(arch, str):
        if arch not in zoo:
            raise UnknownNameError(f'unknown {family} arch {arch!r}; choose from {sorted(zoo)} '
                                   f'or pass a dict with keys {keys}')
        return arch, dict(zoo[arch])
    missing = sorted(set(keys) - set(arch))
    unknown = sorted(set(arch) - set(keys) - set(optional))
    if missing or unknown:
        raise UnknownNameError(f'a custom {family} arch needs exactly the keys {keys}'
                               + (f' (optionally {sorted(optional)})' if optional else '')
                               + f'; missing: {missing}, unknown: {unknown}')
    return 'custom', dict(arch)


NORMS = (nn.LayerNorm, nn.GroupNorm, _BatchNorm)


def init_trunc_normal_(root: nn.Module, layers: Tuple[Type[nn.Module], ...] = (nn.Linear, ),
                       std: float = .02, skip: Iterable[nn.Module] = (),
                       extra: Optional[Mapping[Type[nn.Module], Sequence[str]]] = None) -> None:
    """timm-style from-scratch initialisation of ``root``, module by module in order.

    Weights of ``layers`` get a truncated normal (``std``) and zero biases; norms (LayerNorm,
    GroupNorm, BatchNorm and their subclasses) unit weights and zero biases; parameters named
    in ``extra`` per module type (e.g. relative-position tables) a truncated normal. Modules in
    ``skip`` and their submodules keep their weights (frozen parts such as a tokenizer).
    """
    frozen = {id(m) for s in skip for m in s.modules()}
    for module in root.modules():
        if id(module) in frozen:
            continue
        if isinstance(module, layers):
            nn.init.trunc_normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, NORMS) and getattr(module, 'weight', None) is not None:
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        for kind, names in (extra or {}).items():
            if isinstance(module, kind):
                for name in names:
                    nn.init.trunc_normal_(getattr(module, name), std=std)


@WEIGHT_INITIALIZERS.register_module(name='StrictPretrained')
class StrictPretrainedInit:
    """mmengine's ``Pretrained`` initialisation, strictly, for backbones that mmdet / mmpretrain
    define (Darknet-53, EfficientNet-B0, ResNet): their released checkpoints load unchanged, and
    a missing, unexpected or mis-shaped key is an error that lists them, where mmengine's own
    ``Pretrained`` loads what matches and only warns.

    ``init_cfg=dict(type='StrictPretrained', checkpoint=PATH, prefix='backbone')``: with
    ``prefix``, only that part of a whole-model checkpoint (e.g. an mmpretrain classifier's
    ``backbone.``) is loaded; the rest is reported as dropped in the log.
    """

    def __init__(self, checkpoint: str, prefix: Optional[str] = None) -> None:
        self.checkpoint = checkpoint
        self.prefix = prefix

    def _filter(self, raw: dict, model: nn.Module, dropped: Dict[str, str]) -> Dict:
        state = unwrap_state_dict(raw)
        if not self.prefix:
            return state
        head = self.prefix.rstrip('.') + '.'
        for key in [k for k in state if not k.startswith(head)]:
            dropped[key] = f'outside `{head}` (init_cfg prefix)'
        return {k[len(head):]: v for k, v in state.items() if k.startswith(head)}

    def __call__(self, module: nn.Module) -> None:
        load_pretrained(module, self.checkpoint, self._filter)
        # NOTE: mmengine applies an init_cfg of any type but its own `Pretrained` before the
        # children's init_weights(), which would re-initialise what was just loaded (ConvModule
        # draws Kaiming weights). The load was strict, so every tensor is the checkpoint's: the
        # children are marked initialised, and BaseModule.init_weights skips them.
        for child in module.children():
            child.is_init = True
        if hasattr(module, '_params_init_info'):  # mmengine's record of who set each tensor
            update_init_info(module, init_info=f'StrictPretrained: {self.checkpoint}')
