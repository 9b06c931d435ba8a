"""Discrete Adversarial Training (DAT) as an mmengine hook.

Mao et al., "Enhance the Visual Representation via Discrete Adversarial Training", NeurIPS 2022
(https://arxiv.org/abs/2209.07735). Each training iteration, with a frozen VQ tokenizer Q:

1. x̂ = Q(x) (no grad);
2. g = ∇ₓ̂ L(x̂, y), the model's own total training loss, straight-through (not through Q);
3. δ = α g / ‖g‖₂ per sample (optional random start, L2 cap ε), in [0, 1] pixel units;
4. x_adv = Q(x̂ + δ) (``requantize='reconstruction'``, the reference code) or Q(x + δ)
   (``'input'``, the paper);
5. the model trains on x_adv (``mode='replace'``, the paper's Algorithm 1) or on clean and
   adversarial images together (``mode='append'``, the reference code: the batch is doubled).

The hook wraps the model's data preprocessor, so the attack sees exactly the tensor the model
trains on (after normalisation, padding and batch augments) and the clean and adversarial images
share their random augmentations. The attack pass runs on the unwrapped module (no DDP
all-reduce), takes the gradient with respect to the input only (no parameter ``.grad`` is
touched) and restores every buffer afterwards (BN running statistics are unchanged).
"""
import copy
import os.path as osp
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Dict, Iterator, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.logging import MessageHub, print_log
from mmengine.model import is_model_wrapper

from ...models.data_preprocessors import PixelSpace, patch_forward, valid_mask
from ...models.tokenizers import quantize_images
from ...registry import HOOKS, MODELS

if TYPE_CHECKING:
    from mmengine.runner import Runner

__all__ = ['DATHook', 'preserved_buffers']

DATA_BATCH = Optional[Union[dict, tuple, list]]

MODES = ('replace', 'append')
REQUANTIZE = ('reconstruction', 'input')
NORMS = ('l2', 'linf')


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


@HOOKS.register_module()
class DATHook(Hook):
    """Discrete Adversarial Training for any mmdet detector or mmseg segmentor.

    Args:
        tokenizer: config of the frozen tokenizer (``type='VQGAN'`` with a taming checkpoint or
            one trained by ``tools/train_vq.py``, via ``init_cfg``), or a built module.
        alpha: step size, an L2 norm in [0, 1] RGB pixel units (per image).
        eps: L2 cap of the total perturbation (random start + step); default ``alpha``.
        random_start: start from a random point in the ε-ball (the reference's option).
        norm: ``'l2'`` (the per-sample L2-normalised gradient, the reference) or ``'linf'``
            (``alpha * sign(g)`` per pixel, with ``alpha`` then per pixel; no cap).
        mode: ``'replace'`` trains on x_adv only, ``'append'`` on clean + adversarial.
        requantize: ``'reconstruction'`` for Q(x̂ + δ) or ``'input'`` for Q(x + δ).
        prob: fraction of iterations that get the attack (the others train on the clean batch).
        start_iter: first iteration with the attack.
        seed: seeds ``prob`` and the random start per iteration (and rank), so a resumed run
            makes the same choices.
        channel_order: of the preprocessed batch; ``'auto'`` reads the preprocessor's flip.
        pixel_max: the raw pixel range the preprocessor's mean/std refer to.
        log_interval: iterations between attack statistics in the message hub; they appear in
            the training log as ``dat_loss`` (the loss at x̂), ``dat_delta`` (‖δ‖₂),
            ``dat_codes_changed`` (fraction of x_adv's codes that differ from x's; with
            ``requantize='reconstruction'`` this includes the tokenizer's own drift when it
            re-encodes its reconstruction, Q(x̂) ≠ x̂'s codes) and ``dat_adv_l1``
            (mean |x_adv - x| in [0, 1] pixels).
    """

    priority = 'NORMAL'

    def __init__(self, tokenizer: Union[dict, nn.Module], alpha: float = 0.1,
                 eps: Optional[float] = None, random_start: bool = False, norm: str = 'l2',
                 mode: str = 'replace', requantize: str = 'reconstruction', prob: float = 1.0,
                 start_iter: int = 0, seed: int = 0, channel_order: str = 'auto',
                 pixel_max: float = 255., log_interval: int = 1) -> None:
        for name, value, choices in (('mode', mode, MODES), ('requantize', requantize, REQUANTIZE),
                                     ('norm', norm, NORMS)):
            if value not in choices:
                raise ValueError(f'DATHook: {name} must be one of {choices}, got {value!r}')
        if alpha <= 0 or (eps is not None and eps <= 0):
            raise ValueError(f'DATHook: alpha and eps must be > 0, got {alpha}, {eps}')
        if not 0 <= prob <= 1:
            raise ValueError(f'DATHook: prob must be in [0, 1], got {prob}')
        self.tokenizer_cfg = tokenizer
        self.tokenizer: Optional[nn.Module] = tokenizer if isinstance(tokenizer, nn.Module) \
            else None
        self.alpha, self.eps = float(alpha), float(alpha if eps is None else eps)
        self.random_start, self.norm = random_start, norm
        self.mode, self.requantize, self.prob = mode, requantize, float(prob)
        self.start_iter, self.seed = int(start_iter), int(seed)
        self.channel_order, self.pixel_max = channel_order, float(pixel_max)
        self.log_interval = int(log_interval)
        self._iter: Optional[int] = None   # set inside a training iteration only
        self._undo: Optional[Callable[[], None]] = None
        self._preprocessor: Optional[nn.Module] = None
        self._model: Optional[nn.Module] = None
        self.space: Optional[PixelSpace] = None
        self.last_stats: Dict[str, float] = {}

    # -- set-up ------------------------------------------------------------------------------------
    def build_tokenizer(self, device: torch.device) -> nn.Module:
        if self.tokenizer is None:
            ckpt = (self.tokenizer_cfg.get('init_cfg') or {}).get('checkpoint')
            if ckpt and not osp.isfile(ckpt):
                raise FileNotFoundError(
                    f'DATHook: the tokenizer checkpoint {ckpt} does not exist. Train one on your '
                    'images with `python tools/train_vq.py CONFIG` (e.g. configs/tokenizers/'
                    'vq-small-f16_toy-coco.py for the toy data), or download a taming / '
                    'latent-diffusion VQ checkpoint and set custom_hooks.<i>.tokenizer.init_cfg.'
                    'checkpoint to its path.')
            self.tokenizer = MODELS.build(copy.deepcopy(self.tokenizer_cfg))
            self.tokenizer.init_weights()  # NOTE: loads its init_cfg checkpoint, strictly
        tok = self.tokenizer.to(device).eval().requires_grad_(False)
        for name in ('encode', 'decode', 'factor'):
            if not hasattr(tok, name):
                raise TypeError(f'DATHook: the tokenizer {type(tok).__name__} has no {name!r}; '
                                "use a VQ tokenizer such as dict(type='VQGAN', ...)")
        return tok

    def attach(self, model: nn.Module) -> None:
        """Wrap ``model.data_preprocessor`` (a model wrapper is unwrapped first)."""
        module = model.module if is_model_wrapper(model) else model
        pre = module.data_preprocessor
        device = next((p.device for p in module.parameters()), torch.device('cpu'))
        self.build_tokenizer(device)
        self.space = PixelSpace(pre, self.channel_order, self.pixel_max).to(device)
        self._model, self._preprocessor = module, pre

        def transform(out: dict, training: bool) -> dict:
            if training and self._iter is not None and self.is_active(self._iter):
                out = self.attack(out, self._iter)
            return out

        self._undo = patch_forward(pre, transform)

    def detach(self) -> None:
        """Give the data preprocessor its own ``forward`` back."""
        if self._undo is not None:
            self._undo()
            self._undo, self._preprocessor = None, None

    @contextmanager
    def at_iteration(self, iteration: int) -> Iterator[None]:
        """Within the block, training batches through the patched preprocessor count as
        iteration ``iteration`` (what the runner hooks do around each training step)."""
        self._iter = int(iteration)
        try:
            yield
        finally:
            self._iter = None

    def attack_batch(self, data_batch: dict, iteration: int) -> dict:
        """Preprocess a raw batch as training iteration ``iteration`` does: with the attack
        when the hook is active then (:meth:`is_active`), clean otherwise. Needs
        :meth:`attach`."""
        if self._preprocessor is None:
            raise RuntimeError('DATHook.attack_batch needs the hook attached to a model first '
                               '(DATHook.attach(model))')
        with self.at_iteration(iteration):
            return self._preprocessor(data_batch, True)

    def is_active(self, it: int) -> bool:
        """Whether iteration ``it`` gets the attack (``start_iter`` and the seeded ``prob``)."""
        if it < self.start_iter:
            return False
        if self.prob >= 1:
            return True
        # NOTE: the same draw on every rank, from (seed, iteration): resumes are reproducible
        return bool(np.random.default_rng([self.seed, it]).random() < self.prob)

    # -- runner hooks ------------------------------------------------------------------------------
    def before_train(self, runner: 'Runner') -> None:
        self.attach(runner.model)
        print_log(f'DATHook: mode={self.mode}, requantize={self.requantize}, alpha={self.alpha}, '
                  f'eps={self.eps}, norm={self.norm}, prob={self.prob}, tokenizer '
                  f'{type(self.tokenizer).__name__} ({getattr(self.tokenizer, "arch_name", "")})',
                  logger='current')

    def before_train_iter(self, runner: 'Runner', batch_idx: int,
                          data_batch: DATA_BATCH = None) -> None:
        self._iter = runner.iter

    def after_train_iter(self, runner: 'Runner', batch_idx: int, data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        self._iter = None

    def after_train(self, runner: 'Runner') -> None:
        self.detach()

    def after_run(self, runner: 'Runner') -> None:
        self.detach()

    # -- the attack --------------------------------------------------------------------------------
    def quantize(self, pixels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(Q(pixels), codes) of RGB [0, 1] images."""
        return quantize_images(self.tokenizer, pixels)

    def input_gradient(self, x: torch.Tensor, data_samples: list) -> Tuple[torch.Tensor, float]:
        """(∇ₓ L(x, y) of the model's total training loss, L) without side effects."""
        model = self._model
        x = x.detach().requires_grad_(True)
        with preserved_buffers(model):
            losses = model(x, data_samples, mode='loss')
            loss, _ = model.parse_losses(losses)
            # NOTE: fp16 autocast can underflow the input gradient; the step is normalised per
            # sample, so a constant scale changes nothing else
            fp16 = x.is_cuda and torch.is_autocast_enabled('cuda') and \
                torch.get_autocast_dtype('cuda') == torch.float16
            scale = 2. ** 12 if fp16 else 1.
            grad, = torch.autograd.grad(loss * scale, x)
        return grad / scale, float(loss.detach())

    def perturbation(self, grad: torch.Tensor, mask: torch.Tensor,
                     start: Optional[torch.Tensor]) -> torch.Tensor:
        """δ in pixel units from the pixel-space gradient."""
        grad = torch.nan_to_num(grad) * mask
        dims = tuple(range(1, grad.dim()))
        if self.norm == 'linf':
            return self.alpha * grad.sign()
        step = grad / grad.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *[1] * len(dims))
        delta = self.alpha * step if start is None else start + self.alpha * step
        norm = delta.flatten(1).norm(dim=1).view(-1, *[1] * len(dims))
        return delta * (self.eps / norm.clamp_min(1e-12)).clamp(max=1.)

    def random_start_noise(self, shape: torch.Size, mask: torch.Tensor, it: int) -> torch.Tensor:
        state = np.random.SeedSequence([self.seed, it, get_rank()]).generate_state(1)[0]
        gen = torch.Generator().manual_seed(int(state))
        noise = torch.randn(shape, generator=gen).to(mask.device) * mask
        noise = noise / noise.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, 1, 1, 1)
        radius = torch.rand(shape[0], generator=gen).to(mask.device).view(-1, 1, 1, 1)
        return noise * radius * self.eps

    def attack(self, data: dict, it: int) -> dict:
        """The preprocessed batch ``data`` with its images replaced by (or extended with) x_adv."""
        x, samples = data['inputs'], data.get('data_samples')
        if not torch.is_tensor(x) or x.dim() != 4 or x.shape[1] != 3:
            raise TypeError('DATHook needs a batched (B, 3, H, W) image tensor from the data '
                            f'preprocessor, got {type(x).__name__} '
                            f'{tuple(x.shape) if torch.is_tensor(x) else ""}')
        space = self.space
        mask = valid_mask(samples, tuple(x.shape), x.device)
        with torch.no_grad():
            pixels = space.to_pixels(x)
            x_hat, codes = self.quantize(pixels)
            x_hat = torch.where(mask, x_hat, pixels)
        start = None
        if self.random_start and self.norm == 'l2':
            start = self.random_start_noise(x.shape, mask, it)
        probe = x_hat if start is None else (x_hat + start).clamp(0, 1)
        grad, loss = self.input_gradient(space.from_pixels(probe).to(x.dtype), samples)
        with torch.no_grad():
            delta = self.perturbation(space.grad_to_pixels(grad), mask, start)
            base = x_hat if self.requantize == 'reconstruction' else pixels
            x_adv, adv_codes = self.quantize((base + delta).clamp(0, 1))
            x_adv = torch.where(mask, x_adv, pixels)
            adv = space.from_pixels(x_adv).to(x.dtype)
        self.last_stats = dict(
            dat_loss=loss,
            dat_delta=float(delta.flatten(1).norm(dim=1).mean()),
            dat_codes_changed=float((adv_codes != codes).float().mean()),
            dat_adv_l1=float((x_adv - pixels).abs().mean()))
        if self.log_interval and it % self.log_interval == 0:
            hub = MessageHub.get_current_instance()
            for key, value in self.last_stats.items():
                hub.update_scalar(f'train/{key}', value)
        out = dict(data)
        if self.mode == 'replace':
            out['inputs'] = adv
        else:
            out['inputs'] = torch.cat([x, adv])
            if samples is not None:
                out['data_samples'] = list(samples) + [copy.deepcopy(s) for s in samples]
        return out
