"""Optimizer wrappers: mixed precision on CPUs, and the tokenizer trainer's two optimizers.

mmengine's ``AmpOptimWrapper`` refuses to run without a GPU, so ``--amp`` would be unusable on the
CPU machines mmrobust's toy configs target. CPU autocast supports bfloat16, which has float32's
exponent range and so needs no loss scaling.
"""
import logging
from contextlib import contextmanager
from typing import Iterator, Optional

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper, OptimWrapperDict
from typing_extensions import override

from mmrobust.registry import OPTIM_WRAPPER_CONSTRUCTORS, OPTIM_WRAPPERS

from ..utils.device import cpu_has_native_bf16
from ..utils.errors import ConfigError


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """An optimizer wrapper that runs the forward pass under CPU bfloat16 autocast.

    On a CPU without native bfloat16 (AVX2 only) oneDNN emulates it, and convolutions become
    far slower than in float32; the wrapper says so in the log (the user asked for ``--amp``,
    so it still runs in bfloat16).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, accumulative_counts: int = 1,
                 clip_grad: Optional[dict] = None) -> None:
        super().__init__(optimizer, accumulative_counts, clip_grad)
        if not cpu_has_native_bf16():
            print_log('--amp on a CPU: this CPU has no native bfloat16 (it needs AVX-512), so '
                      'bfloat16 convolutions run emulated, often 10-100x slower than float32. '
                      'Drop --amp on this machine unless you need bfloat16 numerics.',
                      logger='current', level=logging.WARNING)

    @contextmanager
    @override
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        with super().optim_context(model), torch.autocast('cpu', dtype=torch.bfloat16):
            yield


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class VQOptimWrapperConstructor:
    """Builds the generator's and the discriminator's optimiser wrappers.

    Builds ``OptimWrapperDict(generator=..., discriminator=...)`` for :class:`VQTokenizerTrainer`
    from an ``optim_wrapper`` config with one entry per part (the discriminator entry is used only
    when the model has one).
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None) -> None:
        if paramwise_cfg:
            raise ValueError('VQOptimWrapperConstructor: give paramwise_cfg inside the '
                             'generator / discriminator entries')
        unknown = set(optim_wrapper_cfg) - {'generator', 'discriminator'}
        if 'generator' not in optim_wrapper_cfg or unknown:
            raise ConfigError('VQOptimWrapperConstructor needs optim_wrapper = dict('
                              'constructor=..., generator=dict(type=..., optimizer=...), '
                              f'[discriminator=...]); got keys {sorted(optim_wrapper_cfg)}')
        self.cfg = optim_wrapper_cfg

    def __call__(self, model: nn.Module) -> OptimWrapperDict:
        """The ``generator`` and ``discriminator`` wrappers of ``model``'s parts."""
        from ..models.utils import unwrap_model
        model = unwrap_model(model)
        holder = nn.Module()
        # NOTE: the EMA codebook is updated by its averages, not by the optimizer
        holder.params = nn.ParameterList(model.generator_parameters())
        wrappers = {'generator': DefaultOptimWrapperConstructor(
            dict(self.cfg['generator']))(holder)}
        if model.state.discriminator is not None:
            if 'discriminator' not in self.cfg:
                raise ConfigError('gan_weight > 0 needs optim_wrapper.discriminator')
            wrappers['discriminator'] = DefaultOptimWrapperConstructor(
                dict(self.cfg['discriminator']))(model.state.discriminator)
        return OptimWrapperDict(**wrappers)
