"""Mixed precision on CPUs.

mmengine's `AmpOptimWrapper` refuses to run without a GPU, so `--amp` would be unusable on the
CPU machines mmrobust's toy configs target. CPU autocast supports bfloat16, which has float32's
exponent range and so needs no loss scaling.
"""
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn as nn
from mmengine.optim import OptimWrapper

from mmrobust.registry import OPTIM_WRAPPERS


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """An optimizer wrapper that runs the forward pass under CPU bfloat16 autocast."""

    @contextmanager
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        with super().optim_context(model), torch.autocast('cpu', dtype=torch.bfloat16):
            yield
