"""FLOP counting: fused attention in mmengine's complexity analysis (``get_flops.py``).

Also the project's own counter (torch's FlopCounterMode with the CPU attention kernel), which the
benchmarks and the model zoo's metafiles use.

mmengine's jit-based :class:`~mmengine.analysis.FlopAnalyzer` has no handle for
``aten::scaled_dot_product_attention``, which every mmrobust attention calls: it warns once and
counts zero, so mmdet's / mmseg's ``get_flops.py`` under-count FAN, FAN-Swin and Dr-ViT (the toy
FAN-T-Hybrid's global attention was missing from its 14.6 GFLOPs). Importing mmrobust adds the
handle to mmengine's default tables: it only fills that gap, and every other operator keeps
mmengine's handle.
"""
from math import prod
from typing import Any, Callable, List

__all__ = ['sdpa_flop_jit', 'register_flop_handles', 'count_flops']


def _shape(value: Any) -> List[int]:
    return list(value.type().sizes())


def sdpa_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """Multiply-adds of ``softmax(q k^T) v``.

    mmengine counts one FLOP per multiply-add, as for matmul. ``batch * L * S * (E + Ev)`` for q
    ``[..., L, E]``, k ``[..., S, E]`` and v ``[..., S, Ev]``; the softmax and the mask are not
    counted (nor are they for matmul).
    """
    q, k, v = (_shape(x) for x in inputs[:3])
    batch = prod(q[:-2])
    return batch * q[-2] * k[-2] * (q[-1] + v[-1])


def register_flop_handles() -> None:
    """Add the fused-attention handle to mmengine's default FLOP (and activation) tables."""
    from mmengine.analysis import complexity_analysis as ca
    from mmengine.analysis.jit_handles import generic_activation_jit
    ca._DEFAULT_SUPPORTED_FLOP_OPS.setdefault('aten::scaled_dot_product_attention',
                                              sdpa_flop_jit)
    ca._DEFAULT_SUPPORTED_ACT_OPS.setdefault('aten::scaled_dot_product_attention',
                                             generic_activation_jit())


def count_flops(fn: Callable[[], Any]) -> int:
    """FLOPs of ``fn()`` as torch's ``FlopCounterMode`` counts them.

    Matmuls, convolutions and attention; 2 FLOPs per multiply-add. Run without gradient.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    # NOTE: torch's counter knows the GPU attention kernels only; without this, the fused CPU
    # attention of FAN / Dr-ViT would count as free while plain-matmul attention would not
    try:
        fused = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    except (AttributeError, RuntimeError):  # NOTE: torch < 2.2: CPU attention is matmuls, counted
        fused = None
    cpu_attention = {} if fused is None else {
        fused: lambda q, k, v, *args, out_shape=None, **kwargs: sdpa_flop_count(q, k, v)}
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=cpu_attention) as counter:
        fn()
    return int(counter.get_total_flops())
