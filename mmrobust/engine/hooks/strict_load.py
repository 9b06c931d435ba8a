"""Whole-model checkpoint loading that stops on a mismatch instead of warning.

mmengine's Runner loads ``load_from`` / ``--resume`` checkpoints with ``strict=False``: a checkpoint
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
``num_batches_tracked`` is exempt, as mmengine exempts it (the primitives, shared with
:func:`~mmrobust.models.checkpoint.load_checkpoint_strict`, are in
:mod:`mmrobust.models.checkpoint`).

Why a hook and not a patch: replacing mmengine's ``load_checkpoint`` when mmrobust is imported
would change every OpenMMLab model loaded in the same process, including the intended partial
loads of stock recipes (fine-tuning a COCO detector for other classes). The hook is opt-in per
runner: mmrobust's tools register it, and a stock tool gets it with
``--cfg-options default_hooks.strict_load.type=StrictLoadHook`` (configs import mmrobust).
"""
from typing import Dict, Optional

from mmengine.hooks import Hook
from typing_extensions import override

from ...models.checkpoint import check_whole_model, checkpoint_state, loaded_module
from ...registry import HOOKS


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

    @override
    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        model = loaded_module(runner.model)
        state = checkpoint_state(checkpoint)
        self.last_load = check_whole_model(model, state, 'the checkpoint', self.allow_partial,
                                           runner.logger.warning)
        if self.last_load['matched'] == len(state) and not self.last_load['missing']:  # all fit
            runner.logger.info(f'checkpoint matches {type(model).__name__}: all {len(state)} '
                               'tensors (strict load)')


def strict_load_outcome(runner) -> Optional[Dict]:
    """What the runner's :class:`StrictLoadHook` found at its last load (None: no hook or no load).

    Results files record it: what happened rather than which flag was passed.
    """
    hooks = [h for h in runner.hooks if isinstance(h, StrictLoadHook)]
    return hooks[0].last_load if hooks else None
