"""Whole-model checkpoint loading that stops on a mismatch instead of warning.

mmengine's Runner loads `load_from` / `--resume` checkpoints with ``strict=False``: a checkpoint
of another architecture prints "do not match exactly" and the run goes on with a mostly random
model. :class:`StrictLoadHook` checks the checkpoint against the model in mmengine's own
``after_load_checkpoint`` call, which every Runner load (``load_from``, resume, ``test``) goes
through, and raises with the lists before a single tensor is copied. It runs at priority
ABOVE_NORMAL: after hooks that adapt ``checkpoint['state_dict']`` (key converters: give them
priority HIGH or above) and before the hooks that load tensors from it (mmengine's EMAHook,
NORMAL, or 49 in mmdet's configs, whose own load would otherwise stop first with torch's bare
size-mismatch error). It judges by mmengine's own rules:
a dry run of mmengine's loading on a meta-device copy of the model, so every module's
``_load_from_state_dict`` (key remaps, version upgrades) counts and a missing BatchNorm
``num_batches_tracked`` is exempt, as mmengine exempts it.

Why a hook and not a patch: replacing mmengine's ``load_checkpoint`` when mmrobust is imported
would change every OpenMMLab model loaded in the same process, including the intended partial
loads of stock recipes (fine-tuning a COCO detector for other classes). The hook is opt-in per
runner: mmrobust's tools register it, and a stock tool gets it with
``--cfg-options default_hooks.strict_load.type=StrictLoadHook`` (configs import mmrobust).
"""
import re
from typing import Dict, List, Optional, Sequence, Tuple

from mmengine.hooks import Hook
from mmengine.model import BaseTTAModel, is_model_wrapper

from ...models.utils import CheckpointMismatchError, mismatch_message
from ...registry import HOOKS

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


def loaded_module(model):
    """The module mmengine loads a checkpoint into: unwrapped from DDP and from a TTA model."""
    if is_model_wrapper(model):
        model = model.module
    return model.module if isinstance(model, BaseTTAModel) else model


def loadable_state(module, prefix: str = '') -> Dict:
    """The state dict as mmengine's ``load_state_dict`` matches it: wrappers (DDP, TTA) are
    unwrapped at every depth, so a submodule that ``MMSeparateDistributedDataParallel`` wrapped
    keeps its own key names (``tokenizer.encoder...``, not ``tokenizer.module.encoder...``)."""
    if is_model_wrapper(module) or isinstance(module, BaseTTAModel):
        module = module.module
    state = {prefix + n: p for n, p in module._parameters.items() if p is not None}
    state.update({prefix + n: b for n, b in module._buffers.items()
                  if b is not None and n not in module._non_persistent_buffers_set})
    for name, child in module._modules.items():
        if child is not None:
            state.update(loadable_state(child, f'{prefix}{name}.'))
    return state


def _meta_copy(module):
    """A structural copy of ``module`` whose parameters and buffers live on the meta device (no
    memory): loading into it runs every module's own ``_load_from_state_dict`` and copies
    nothing."""
    import copy

    import torch
    memo = {}
    for tensor in list(module.parameters()) + list(module.buffers()):
        meta = torch.empty_like(tensor, device='meta')
        memo[id(tensor)] = (torch.nn.Parameter(meta, requires_grad=tensor.requires_grad)
                            if isinstance(tensor, torch.nn.Parameter) else meta)
    return copy.deepcopy(module, memo)


def dry_run_load(module, state: Dict) -> Tuple[List[str], List[str], List[str]]:
    """``(missing, unexpected, errors)`` of loading ``state`` into ``module`` as mmengine's
    ``load_state_dict`` does (its traversal, each module's ``_load_from_state_dict`` with its key
    remaps and version upgrades, missing ``num_batches_tracked`` exempt), on a meta copy."""
    import warnings
    missing: List[str] = []
    unexpected: List[str] = []
    errors: List[str] = []
    metadata = getattr(state, '_metadata', None)
    state = dict(state)

    def load(mod, prefix: str = '') -> None:
        if is_model_wrapper(mod) or isinstance(mod, BaseTTAModel):
            mod = mod.module
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



@HOOKS.register_module()
class StrictLoadHook(Hook):
    """Stop a Runner's checkpoint load when keys are missing, unexpected or mis-shaped.

    Args:
        allow_partial: load anyway and log the lists as a warning (the explicit opt-out for an
            intended partial load, e.g. fine-tuning with another number of classes).
    """

    # NOTE: after hooks that adapt checkpoint['state_dict'] (HIGH and above), before EMAHook
    # (NORMAL; 49 in mmdet's configs), which loads the checkpoint into its EMA copy
    priority = 'ABOVE_NORMAL'

    def __init__(self, allow_partial: bool = False) -> None:
        self.allow_partial = allow_partial
        #: what the last load did: tensors matched and the missing / unexpected keys and the
        #: errors (shapes) mmengine's loading would meet; None before any load
        self.last_load: Optional[Dict] = None

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        model = loaded_module(runner.model)
        state = checkpoint_state(checkpoint)
        missing, unexpected, errors = dry_run_load(model, state)
        self.last_load = {'matched': len(state) - len(unexpected) - len(errors),
                          'missing': sorted(missing), 'unexpected': sorted(unexpected),
                          'errors': errors}
        if not (missing or unexpected or errors):
            runner.logger.info(f'checkpoint matches {type(model).__name__}: all {len(state)} '
                               'tensors (strict load)')
            return
        header = f'the checkpoint does not match the model ({type(model).__name__}):'
        message = mismatch_message(header, missing, unexpected, errors)
        if self.allow_partial:
            runner.logger.warning(f'PARTIAL LOAD ({PARTIAL_LOAD_FLAG}): {message}; missing '
                                  'weights keep their initialisation')
            return
        raise CheckpointMismatchError(
            f'{message}. Is it a checkpoint of another architecture, variant or number of '
            'classes? Use the config it was trained with. For an intended partial load (e.g. '
            f'fine-tuning), pass {PARTIAL_LOAD_FLAG}; the lists are then logged.')


def strict_load_outcome(runner) -> Optional[Dict]:
    """What the runner's :class:`StrictLoadHook` found at its last load (None: no hook or no
    load), for results files to record what happened rather than which flag was passed."""
    hooks = [h for h in runner.hooks if isinstance(h, StrictLoadHook)]
    return hooks[0].last_load if hooks else None
