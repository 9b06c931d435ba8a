"""What the machine's processor runs natively, for choices that only change speed."""
import functools

import torch

__all__ = ['cpu_has_native_bf16']


@functools.lru_cache(maxsize=None)
def cpu_has_native_bf16() -> bool:
    """Whether oneDNN runs bfloat16 kernels natively on this CPU (AVX-512 and up).

    NOTE: on an AVX2-only CPU, bfloat16 convolutions take oneDNN's reference path: a 3x3
    convolution of a 2x32x256x256 batch took 5.7 s in bf16 against 0.03 s in fp32 on an AVX2
    AMD EPYC, so bf16 autocast there is a 100x slowdown, not a speed-up.
    """
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # NOTE: a torch build without oneDNN
        return False
