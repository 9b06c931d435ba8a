"""Mixed precision on CPUs.

mmengine's `AmpOptimWrapper` refuses to run without a GPU, so `--amp` would be unusable on the
CPU machines mmrobust's toy configs target. CPU autocast supports bfloat16, which has float32's
exponent range and so needs no loss scaling.
"""
import logging
from contextlib import contextmanager
from typing import Iterator, Optional

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper

from mmrobust.registry import OPTIM_WRAPPERS

from ..utils.device import cpu_has_native_bf16


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
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        with super().optim_context(model), torch.autocast('cpu', dtype=torch.bfloat16):
            yield
