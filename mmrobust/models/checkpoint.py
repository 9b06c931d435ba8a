"""Checkpoints in and out of mmrobust models.

One home for unwrapping, mismatch reporting and strict loading.

Three kinds of load go through here, each strictly (a missing, unexpected or mis-shaped key is an
error that lists the keys, never a warning that scrolls by):

- a foreign backbone / tokenizer checkpoint, converted by the family's own pure
  ``checkpoint_filter_fn`` and loaded by :func:`load_pretrained` / :func:`load_state_dict_strict`
  (``init_cfg=dict(type='Pretrained')``, ``tools/model_converters``);
- a released mmdet / mmpretrain backbone, by :class:`StrictPretrainedInit`;
- a whole-model mmengine checkpoint, by :func:`load_checkpoint_strict` (the API and analysis
  tools) and by :class:`~mmrobust.engine.StrictLoadHook` (a Runner's ``load_from`` / resume),
  both judging by mmengine's own rules through :func:`dry_run_load`.

Reading a file safely (the torch >= 2.6 allow-list, Lightning ``.ckpt``) is
:mod:`mmrobust.utils.checkpoint`'s.
"""
import copy
import logging
import os.path as osp
import re
import warnings
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.logging import MMLogger, print_log
from mmengine.model import BaseTTAModel
from mmengine.model.weight_init import update_init_info
from mmengine.registry import WEIGHT_INITIALIZERS
from mmengine.runner.checkpoint import CheckpointLoader, _load_checkpoint

from ..utils.checkpoint import UnsafeCheckpointError, load_lightning_checkpoint, safe_load
from ..utils.errors import InputNotFoundError, MMRobustError
from .utils import unwrap_model

__all__ = ['CheckpointMismatchError', 'PARTIAL_LOAD_FLAG', 'StrictPretrainedInit',
           'check_whole_model', 'checkpoint_state', 'dropped_summary', 'dry_run_load',
           'load_checkpoint_strict',
           'load_pretrained', 'load_state_dict_strict', 'load_tokenizer_checkpoint',
           'loadable_state', 'loaded_module', 'mismatch_message', 'state_dict_mismatch',
           'unwrap_state_dict']

_WRAPPERS = ('state_dict', 'model', 'state_dict_ema', 'model_ema')


class CheckpointMismatchError(MMRobustError, RuntimeError):
    """A checkpoint does not fit the model it is loaded into."""


def unwrap_state_dict(checkpoint: dict, strip_prefixes: Iterable[str] = ('module.',)) -> Dict:
    """The weights of a checkpoint.

    Unwrapped (``state_dict`` / ``model`` / ``state_dict_ema``, in that order) and without DDP
    ``module.`` prefixes.
    """
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
    """Missing, unexpected and mis-shaped keys of ``state_dict``.

    ``(missing, unexpected, mis-shaped)`` keys of ``state_dict`` against a model's ``own`` state
    dict; model keys starting with a prefix in ``allowed_missing`` may be absent.
    """
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
    """Load ``state_dict`` into ``model``; every key must match in name and shape.

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
    """``dropped`` (checkpoint key -> reason) as one line per reason; '' when empty.

    For example ``dropped 2 keys: head.bias, head.weight (ImageNet classifier ...)``.
    """
    by_reason: Dict[str, list] = {}
    for key, reason in dropped.items():
        by_reason.setdefault(reason, []).append(key)
    return '\n'.join(f'dropped {len(keys)} key{"s" if len(keys) > 1 else ""}: '
                     f'{_list(keys, limit)} ({reason})' for reason, keys in by_reason.items())


def load_pretrained(model: nn.Module, checkpoint: str,
                    filter_fn: Callable[[Dict, nn.Module, Dict[str, str]], Dict],
                    allowed_missing: Iterable[str] = (),
                    logger: Optional[MMLogger] = None) -> None:
    """Load a (foreign) checkpoint file through ``filter_fn`` and :func:`load_state_dict_strict`.

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


# -- whole-model checkpoints, by mmengine's rules --------------------------------------------------

#: the key revision mmengine's Runner applies before loading (DDP prefixes)
RUNNER_REVISE_KEYS: Sequence[Tuple[str, str]] = ((r'^module\.', ''), )

PARTIAL_LOAD_FLAG = '--allow-partial-load'


def checkpoint_state(checkpoint: object, source: str = 'checkpoint') -> Dict:
    """The weights of an mmengine checkpoint (or a plain state dict) with the Runner's keys."""
    if not isinstance(checkpoint, dict):
        raise CheckpointMismatchError(
            f'{source} holds a {type(checkpoint).__name__}, not a checkpoint (a dict with '
            '`state_dict`, or a state dict of tensors)')
    state = checkpoint.get('state_dict', checkpoint)
    if not isinstance(state, dict):
        raise CheckpointMismatchError(f'{source}: `state_dict` is a {type(state).__name__}, '
                                      'not a dict of tensors')
    revised = {}
    for key, value in state.items():
        for pattern, repl in RUNNER_REVISE_KEYS:
            key = re.sub(pattern, repl, key)
        revised[key] = value
    return revised


def loaded_module(model: nn.Module) -> nn.Module:
    """The module mmengine loads a checkpoint into: unwrapped from DDP and from a TTA model."""
    model = unwrap_model(model)
    return model.module if isinstance(model, BaseTTAModel) else model


def loadable_state(module: nn.Module, prefix: str = '') -> Dict:
    """The state dict as mmengine's ``load_state_dict`` matches it.

    Wrappers (DDP, TTA) are unwrapped at every depth, so a submodule that
    ``MMSeparateDistributedDataParallel`` wrapped keeps its own key names (``tokenizer.encoder...``,
    not ``tokenizer.module.encoder...``).
    """
    module = loaded_module(module)
    state = {prefix + n: p for n, p in module._parameters.items() if p is not None}
    state.update({prefix + n: b for n, b in module._buffers.items()
                  if b is not None and n not in module._non_persistent_buffers_set})
    for name, child in module._modules.items():
        if child is not None:
            state.update(loadable_state(child, f'{prefix}{name}.'))
    return state


def _meta_copy(module: nn.Module) -> nn.Module:
    """A structural copy of ``module`` whose parameters and buffers live on the meta device.

    No memory. Loading into it runs every module's own ``_load_from_state_dict`` and copies nothing.
    """
    memo = {}
    for tensor in list(module.parameters()) + list(module.buffers()):
        meta = torch.empty_like(tensor, device='meta')
        memo[id(tensor)] = (torch.nn.Parameter(meta, requires_grad=tensor.requires_grad)
                            if isinstance(tensor, torch.nn.Parameter) else meta)
    return copy.deepcopy(module, memo)


def dry_run_load(module: nn.Module, state: Dict) -> Tuple[List[str], List[str], List[str]]:
    """What loading ``state`` into ``module`` as mmengine does would meet.

    ``(missing, unexpected, errors)`` of loading ``state`` into ``module`` as mmengine's
    ``load_state_dict`` does (its traversal, each module's ``_load_from_state_dict`` with its key
    remaps and version upgrades, missing ``num_batches_tracked`` exempt), on a meta copy.
    """
    missing: List[str] = []
    unexpected: List[str] = []
    errors: List[str] = []
    metadata = getattr(state, '_metadata', None)
    state = dict(state)

    def load(mod, prefix: str = '') -> None:
        mod = loaded_module(mod)
        local = {} if metadata is None else metadata.get(prefix[:-1], {})
        mod._load_from_state_dict(state, prefix, local, True, missing, unexpected, errors)
        for name, child in mod._modules.items():
            if child is not None:
                load(child, f'{prefix}{name}.')

    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # NOTE: "copying into a meta parameter is a no-op"
        load(_meta_copy(module))
    # NOTE: mmengine's own exemption (load_state_dict): BatchNorm counters may be absent
    missing = [k for k in missing if 'num_batches_tracked' not in k]
    return missing, unexpected, [_short_error(e) for e in errors]


_SIZE = re.compile(r'size mismatch for (\S+): copying a param with shape torch\.Size\(\[(.*?)\]\) '
                   r'from checkpoint, the shape in current model is torch\.Size\(\[(.*?)\]\)')


def _short_error(error: str) -> str:
    """torch's "size mismatch for k: ..." as ``k: checkpoint (a, b) vs model (c, d)``."""
    match = _SIZE.match(error)
    if not match:
        return error
    key, ckpt, own = match.groups()
    return f'{key}: checkpoint ({ckpt}) vs model ({own})'


def check_whole_model(model: nn.Module, state: Dict, source: str, allow_partial: bool,
                      warn: Callable[[str], None]) -> Dict:
    """Judge ``state`` against ``model`` by mmengine's rules (:func:`dry_run_load`).

    The one verdict of :class:`~mmrobust.engine.StrictLoadHook` and
    :func:`load_checkpoint_strict`: a mismatch raises with the lists, or, with ``allow_partial``
    (the explicit opt-out), goes to ``warn`` as a ``PARTIAL LOAD``.

    Returns:
        What the load meets: ``matched`` tensors, sorted ``missing`` and ``unexpected`` keys,
        ``errors`` (shape mismatches).

    Raises:
        CheckpointMismatchError: a key is missing, unexpected or mis-shaped and not
            ``allow_partial``.
    """
    missing, unexpected, errors = dry_run_load(model, state)
    outcome = {'matched': len(state) - len(unexpected) - len(errors),
               'missing': sorted(missing), 'unexpected': sorted(unexpected), 'errors': errors}
    if not (missing or unexpected or errors):
        return outcome
    message = mismatch_message(f'{source} does not match {type(model).__name__}:', missing,
                               unexpected, errors)
    if not allow_partial:
        raise CheckpointMismatchError(
            f'{message}. Is it a checkpoint of another architecture, variant or number of '
            'classes? Use the config it was trained with. For an intended partial load (e.g. '
            f'fine-tuning), pass {PARTIAL_LOAD_FLAG} (allow_partial_load=True in the API); the '
            'lists are then logged.')
    warn(f'PARTIAL LOAD ({PARTIAL_LOAD_FLAG}): {message}; missing weights keep their '
         'initialisation')
    return outcome


def load_checkpoint_strict(model: nn.Module, checkpoint: str,
                           allow_partial_load: bool = False) -> dict:
    """Load a whole-model checkpoint (mmengine's, or a plain state dict) into ``model``.

    Every key must load (by mmengine's rules: each module's key remaps count, a missing BatchNorm
    ``num_batches_tracked`` is exempt) unless ``allow_partial_load`` (then the lists are logged).

    Returns:
        The raw checkpoint (for its ``meta``).
    """
    raw = _load_checkpoint(checkpoint, map_location='cpu')
    state = checkpoint_state(raw, checkpoint)
    model = loaded_module(model)
    outcome = check_whole_model(
        model, state, checkpoint, allow_partial_load,
        lambda message: print_log(message, logger='current', level=logging.WARNING))
    if outcome['matched'] < len(state) or outcome['missing']:
        own = loadable_state(model)
        state = {k: v for k, v in state.items() if k in own and v.shape == own[k].shape}
    model.load_state_dict(state, strict=False)
    return raw


def load_tokenizer_checkpoint(path: str) -> Dict[str, torch.Tensor]:
    """The state dict of a tokenizer checkpoint: plain, mmengine-wrapped or Lightning ``.ckpt``."""
    try:
        raw = safe_load(path, map_location='cpu')
    except UnsafeCheckpointError:
        raw = load_lightning_checkpoint(path)
    return unwrap_state_dict(raw, strip_prefixes=())


@WEIGHT_INITIALIZERS.register_module(name='StrictPretrained')
class StrictPretrainedInit:
    """mmengine's ``Pretrained`` initialisation, strictly.

    Used for backbones that mmdet / mmpretrain define (Darknet-53, EfficientNet-B0, ResNet): their
    released checkpoints load unchanged, and a missing, unexpected or mis-shaped key is an error
    that lists them, where mmengine's own ``Pretrained`` loads what matches and only warns.

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
        """Load the checkpoint into ``module`` strictly."""
        load_pretrained(module, self.checkpoint, self._filter)
        # NOTE: mmengine applies an init_cfg of any type but its own `Pretrained` before the
        # children's init_weights(), which would re-initialise what was just loaded (ConvModule
        # draws Kaiming weights). The load was strict, so every tensor is the checkpoint's: the
        # children are marked initialised, and BaseModule.init_weights skips them.
        for child in module.children():
            child.is_init = True
        if hasattr(module, '_params_init_info'):  # mmengine's record of who set each tensor
            update_init_info(module, init_info=f'StrictPretrained: {self.checkpoint}')
