"""One adversarial step, shared by Discrete Adversarial Training and the attack cells.

Everything here works in RGB [0, 1] pixels (see
:class:`~mmrobust.models.data_preprocessors.PixelSpace`) on batches of images with a validity
mask (1 on each image's own area, 0 on the batch padding), per image:

- :func:`preserved_buffers` and :func:`eval_mode`: the model is left as it was (BN statistics,
  counters, train / eval);
- :func:`input_gradient`: ∇ₓ of a loss w.r.t. the input only (no parameter ``.grad`` is
  touched), scaled under fp16 autocast so it does not underflow, with a per-image flag for
  non-finite gradients (an fp16 overflow has no direction: that image takes no step);
- :func:`step_direction`: ``sign(g)`` (L-inf) or ``g / ‖g‖₂`` (L2) per image, 0 where the
  gradient is not finite;
- :func:`project`: into the ε-ball, into [0, 1], zero on the padding;
- :func:`random_start`: a uniform point of the L-inf or L2 ε-ball over the image's own area.
"""
import math
from contextlib import contextmanager
from typing import Callable, Iterator, Tuple

import torch
import torch.nn as nn

__all__ = ['eval_mode', 'finite_images', 'input_gradient', 'l2_norms', 'preserved_buffers',
           'project', 'random_start', 'step_direction']

#: the loss scale under fp16 autocast: the input gradient of a mean loss over a large image is
#: ~1e-8 per value, below fp16's smallest normal; a constant scale changes no direction
FP16_SCALE = 2. ** 12


@contextmanager
def preserved_buffers(module: nn.Module) -> Iterator[None]:
    """Restores every buffer (BN running statistics, counters) of ``module`` on exit."""
    saved = [(buf, buf.detach().clone()) for buf in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, value in saved:
                buf.copy_(value)


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """``module`` in eval mode with its buffers preserved; its train / eval state restored."""
    training = module.training
    module.eval()
    try:
        with preserved_buffers(module):
            yield
    finally:
        module.train(training)


def _fp16_autocast(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.is_autocast_enabled('cuda') and \
        torch.get_autocast_dtype('cuda') == torch.float16


def input_gradient(loss_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
                   ) -> Tuple[torch.Tensor, float]:
    """``(∇ₓ loss_fn(x), loss)``: the gradient with respect to the input alone.

    Under fp16 autocast the loss is scaled before the backward pass and the gradient unscaled
    after. The gradient may hold non-finite values (check with
    :func:`finite_images`).
    """
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = loss_fn(x)
        scale = FP16_SCALE if _fp16_autocast(x) else 1.
        grad, = torch.autograd.grad(loss * scale, x)
    return grad / scale, float(loss.detach())


def finite_images(grad: torch.Tensor) -> torch.Tensor:
    """(B, 1, 1, 1) booleans: whether each image's gradient is finite everywhere."""
    return torch.isfinite(grad).flatten(1).all(dim=1).view(-1, *[1] * (grad.dim() - 1))


def l2_norms(t: torch.Tensor) -> torch.Tensor:
    """Each image's L2 norm, shaped to broadcast over it."""
    return t.flatten(1).norm(dim=1).view(-1, *[1] * (t.dim() - 1))


def step_direction(grad: torch.Tensor, norm: str, mask: torch.Tensor) -> torch.Tensor:
    """The steepest-ascent direction of unit ``norm`` per image, on the valid area.

    0 for an image whose gradient is not finite.
    """
    finite = finite_images(grad)
    grad = torch.where(finite, grad, torch.zeros_like(grad)) * mask
    if norm == 'linf':
        return grad.sign()
    return grad / l2_norms(grad).clamp_min(1e-12)


def project(delta: torch.Tensor, eps: float, norm: str, x0: torch.Tensor,
            mask: torch.Tensor) -> torch.Tensor:
    """δ inside the ε-ball of ``norm``, x0 + δ inside [0, 1], zero on the padding."""
    if norm == 'linf':
        delta = delta.clamp(-eps, eps)
    else:
        delta = delta * (eps / l2_norms(delta).clamp_min(1e-12)).clamp(max=1.0)
    return ((x0 + delta).clamp(0, 1) - x0) * mask


def random_start(norm: str, eps: float, mask: torch.Tensor, generator: torch.Generator
                 ) -> torch.Tensor:
    """A point drawn uniformly from the ε-ball of ``norm`` over one image's valid area.

    ``mask`` is that image's (1 or 3, H, W) validity mask; the draw happens on the CPU from
    ``generator`` (so a seed gives the same start on any device) and is zero on the padding.
    L2: a Gaussian direction normalised over the valid values, and radius ε·U^(1/d) with d the
    number of valid values (the radius law of the uniform distribution in a d-ball).
    """
    valid = mask.expand(3, *mask.shape[-2:]).cpu()
    if norm == 'linf':
        point = (torch.rand(valid.shape, generator=generator) * 2 - 1) * eps
        return point.to(mask.device) * mask
    direction = torch.randn(valid.shape, generator=generator) * valid
    direction = direction / direction.norm().clamp_min(1e-12)
    count = int(valid.sum())
    u = float(torch.rand((), generator=generator))
    # NOTE: U^(1/d) in log space: d is ~10^6 for a real image
    radius = eps * math.exp(math.log(max(u, 1e-300)) / max(count, 1))
    return (direction * radius).to(mask.device)
