"""Discrete Adversarial Training (DAT) as an mmengine hook.

Mao et al., "Enhance the Visual Representation via Discrete Adversarial Training", NeurIPS 2022
(https://arxiv.org/abs/2209.07735). Each training iteration, with a frozen VQ tokenizer Q:

1. x̂ = Q(x) (no grad);
2. g = ∇ₓ̂ L(x̂, y), the model's own total training loss, straight-through (not through Q);
3. δ = α g / ‖g‖₂ per sample (optional random start, L2 cap ε), in [0, 1] pixel units
   (``budget='image'``: α and ε are norms over the whole image, as in the reference; or
   ``'pixel_rms'``: the RMS change per pixel, the same at any resolution);
4. x_adv = Q(x̂ + δ) (``requantize='reconstruction'``, the reference code) or Q(x + δ)
   (``'input'``, the paper);
5. the model trains on x_adv (``mode='replace'``, the paper's Algorithm 1) or on clean and
   adversarial images together (``mode='append'``, the reference code: the batch is doubled).

The hook wraps the model's data preprocessor, so the attack sees exactly the tensor the model
trains on (after normalisation, padding and batch augments) and the clean and adversarial images
share their random augmentations. The attack pass runs on the unwrapped module (no DDP
all-reduce), takes the gradient with respect to the input only (no parameter ``.grad`` is
touched) and restores every buffer afterwards (BN running statistics are unchanged). SyncBN
layers stay synchronised in the attack pass: it differentiates the function that is trained
(statistics over all GPUs), and a global pool followed by BN works at one image per GPU as it
does in training. Whether an iteration is attacked, and whether it takes a random start, are
drawn from (seed, iteration) alone, so every rank runs the attack pass at the same iterations
and SyncBN's collectives (and mmdet's ``reduce_mean`` in the losses) pair up.
"""
import copy
import logging
import os.path as osp
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Dict, Iterator, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.logging import MessageHub, print_log
from typing_extensions import override

from ...models.adversarial import (
    finite_images,
    input_gradient,
    l2_norms,
    preserved_buffers,
    step_direction,
)
from ...models.data_preprocessors import PixelSpace, patch_forward, valid_mask
from ...models.tokenizers import quantize_images
from ...models.utils import unwrap_model
from ...registry import HOOKS, MODELS
from ...utils.errors import InputNotFoundError

if TYPE_CHECKING:
    from mmengine.runner import Runner

__all__ = ['DATHook']

DATA_BATCH = Optional[Union[dict, tuple, list]]

MODES = ('replace', 'append')
REQUANTIZE = ('reconstruction', 'input')
NORMS = ('l2', 'linf')
BUDGETS = ('image', 'pixel_rms')


@HOOKS.register_module()
class DATHook(Hook):
    """Discrete Adversarial Training for any mmdet detector or mmseg segmentor.

    Args:
        tokenizer: config of the frozen tokenizer (``type='VQGAN'`` with a taming checkpoint or
            one trained by ``tools/train_vq.py``, via ``init_cfg``), or a built module.
        alpha: step size, an L2 norm in [0, 1] RGB pixel units (per image, see ``budget``).
            0 trains on the VQ round trip alone (no attack pass): the ablation arm that
            separates discretisation as augmentation from the attack.
        eps: L2 cap of the total perturbation (random start + step); default ``alpha``.
        random_start: start from a random point on the ε-sphere around x̂, clamped to [0, 1]
            (the reference's option; L2 only), in a fraction ``random_start_prob`` of the
            attacked batches.
        random_start_prob: the probability of that start per attacked batch (the reference:
            0.8).
        norm: ``'l2'`` (the per-sample L2-normalised gradient, the reference) or ``'linf'``
            (``alpha * sign(g)`` per pixel, with ``alpha`` then per pixel; no cap).
        budget: what ``alpha`` and ``eps`` measure for ``norm='l2'``: ``'image'``, the L2 norm
            over the whole image (the reference; the RMS change per pixel then shrinks with the
            image: α = 0.1 is 2.6e-4 per pixel at 224², 5.6e-5 at 1333x800), or
            ``'pixel_rms'``, the RMS change per pixel over the image's valid (unpadded) area,
            so a setting transfers across resolutions (α = 2.6e-4 here is α = 0.1 at 224²).
        mode: ``'replace'`` trains on x_adv only, ``'append'`` on clean + adversarial.
        requantize: ``'reconstruction'`` for Q(x̂ + δ) or ``'input'`` for Q(x + δ).
        prob: fraction of iterations that get the attack (the others train on the clean batch).
        start_iter: first iteration with the attack.
        seed: seeds ``prob`` and the random start per iteration (and rank), so a resumed run
            makes the same choices.
        channel_order: of the preprocessed batch; ``'auto'`` reads the preprocessor's flip.
        pixel_max: the raw pixel range the preprocessor's mean/std refer to.
        log_interval: iterations between attack statistics in the message hub; they appear in
            the training log as ``dat_loss`` (the loss at x̂; absent with ``alpha=0``),
            ``dat_delta`` (‖δ‖₂),
            ``dat_random_start`` (1 when the batch took a random start),
            ``dat_codes_changed`` (fraction of x_adv's codes that differ from x's; with
            ``requantize='reconstruction'`` this includes the tokenizer's own drift when it
            re-encodes its reconstruction, Q(x̂) ≠ x̂'s codes) and ``dat_adv_l1``
            (mean |x_adv - x| in [0, 1] pixels).
    """

    priority = 'NORMAL'

    def __init__(self, tokenizer: Union[dict, nn.Module], alpha: float = 0.1,
                 eps: Optional[float] = None, random_start: bool = False,
                 random_start_prob: float = 1.0, norm: str = 'l2', budget: str = 'image',
                 mode: str = 'replace', requantize: str = 'reconstruction', prob: float = 1.0,
                 start_iter: int = 0, seed: int = 0, channel_order: str = 'auto',
                 pixel_max: float = 255., log_interval: int = 1) -> None:
        for name, value, choices in (('mode', mode, MODES), ('requantize', requantize, REQUANTIZE),
                                     ('norm', norm, NORMS), ('budget', budget, BUDGETS)):
            if value not in choices:
                raise ValueError(f'DATHook: {name} must be one of {choices}, got {value!r}')
        if alpha < 0 or (eps is not None and eps < 0):
            raise ValueError(f'DATHook: alpha and eps must be >= 0 (0: the VQ round trip without '
                             f'an attack), got {alpha}, {eps}')
        for name, value in (('prob', prob), ('random_start_prob', random_start_prob)):
            if not 0 <= value <= 1:
                raise ValueError(f'DATHook: {name} must be in [0, 1], got {value}')
        if random_start and random_start_prob > 0 and (
                norm != 'l2' or alpha == 0 or (eps is not None and eps == 0)):
            raise ValueError(
                f"DATHook: random_start is defined for norm='l2' with alpha and eps > 0 (the "
                f"reference's start on the eps-sphere); got norm={norm!r}, alpha={alpha}, "
                f'eps={eps}. Drop random_start, or use the L2 attack')
        if budget == 'pixel_rms' and norm != 'l2':
            raise ValueError("DATHook: budget='pixel_rms' rescales L2 norms; with norm='linf' "
                             'alpha is per pixel already')
        self.tokenizer_cfg = tokenizer
        self.tokenizer: Optional[nn.Module] = tokenizer if isinstance(tokenizer, nn.Module) \
            else None
        self.alpha, self.eps = float(alpha), float(alpha if eps is None else eps)
        self.random_start, self.random_start_prob = random_start, float(random_start_prob)
        self.norm, self.budget = norm, budget
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
        #: images whose attack gradient was not finite (not attacked), over the run
        self.skipped_nonfinite = 0
        self._batch_nonfinite = 0

    # -- set-up ------------------------------------------------------------------------------------
    def build_tokenizer(self, device: torch.device) -> nn.Module:
        """The frozen tokenizer on ``device``, built and loaded once."""
        if self.tokenizer is None:
            ckpt = (self.tokenizer_cfg.get('init_cfg') or {}).get('checkpoint')
            if ckpt and not osp.isfile(ckpt):
                raise InputNotFoundError(
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
        module = unwrap_model(model)
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
        """Count the training batches within the block as iteration ``iteration``.

        Within the block, training batches through the patched preprocessor count as iteration
        ``iteration`` (what the runner hooks do around each training step).
        """
        self._iter = int(iteration)
        try:
            yield
        finally:
            self._iter = None

    def attack_batch(self, data_batch: dict, iteration: int) -> dict:
        """Preprocess a raw batch as training iteration ``iteration`` does.

        The batches run with the attack when the hook is active then (:meth:`is_active`), clean
        otherwise. Needs :meth:`attach`.
        """
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

    def takes_random_start(self, it: int) -> bool:
        """Whether attacked iteration ``it`` starts from a random point.

        One coin per batch, as the reference; drawn from (seed, iteration), the same on every rank.
        """
        if not self.random_start or self.norm != 'l2' or self.eps == 0:
            return False
        if self.random_start_prob >= 1:
            return True
        return bool(np.random.default_rng([self.seed, it, 1]).random() < self.random_start_prob)

    # -- runner hooks ------------------------------------------------------------------------------
    @override
    def before_train(self, runner: 'Runner') -> None:
        self.attach(runner.model)
        print_log(f'DATHook: mode={self.mode}, requantize={self.requantize}, alpha={self.alpha}, '
                  f'eps={self.eps} ({self.budget}), norm={self.norm}, prob={self.prob}, random '
                  f'start={self.random_start_prob if self.random_start else 0}, tokenizer '
                  f'{type(self.tokenizer).__name__} ({getattr(self.tokenizer, "arch_name", "")})',
                  logger='current')

    @override
    def before_train_iter(self, runner: 'Runner', batch_idx: int,
                          data_batch: DATA_BATCH = None) -> None:
        self._iter = runner.iter

    @override
    def after_train_iter(self, runner: 'Runner', batch_idx: int, data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        self._iter = None

    @override
    def after_train(self, runner: 'Runner') -> None:
        self.detach()

    @override
    def after_run(self, runner: 'Runner') -> None:
        self.detach()

    # -- the attack --------------------------------------------------------------------------------
    def quantize(self, pixels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(Q(pixels), codes) of RGB [0, 1] images."""
        return quantize_images(self.tokenizer, pixels)

    def input_gradient(self, x: torch.Tensor, data_samples: list) -> Tuple[torch.Tensor, float]:
        """(∇ₓ L(x, y) of the model's total training loss, L) without side effects.

        See :func:`mmrobust.models.adversarial.input_gradient`: fp16 loss scaling included.
        """
        model = self._model

        def loss(inputs: torch.Tensor) -> torch.Tensor:
            return model.parse_losses(model(inputs, data_samples, mode='loss'))[0]
        with preserved_buffers(model):
            return input_gradient(loss, x)

    def budget_scale(self, mask: torch.Tensor) -> torch.Tensor:
        """Per image, what turns ``alpha`` / ``eps`` into an L2 norm over the image.

        1, or for ``budget='pixel_rms'`` the square root of the image's valid (unpadded) pixel
        values.
        """
        ones = torch.ones(mask.shape[0], 1, 1, 1, device=mask.device)
        if self.budget == 'image':
            return ones
        count = mask.expand(mask.shape[0], 3, *mask.shape[2:]).flatten(1).sum(1).float()
        return count.sqrt().view(-1, 1, 1, 1)

    def perturbation(self, grad: torch.Tensor, mask: torch.Tensor,
                     start: Optional[torch.Tensor]) -> torch.Tensor:
        """δ in pixel units from the pixel-space gradient.

        ``start``: the random start's offset from x̂, included in δ and in its cap.
        """
        # NOTE: a non-finite gradient (fp16 overflow) has no direction: that image is not
        # attacked (δ = 0), and counted, rather than stepped to a saturated pixel
        finite = finite_images(grad)
        self._batch_nonfinite = int((~finite).sum())
        self.skipped_nonfinite += self._batch_nonfinite
        if self.norm == 'linf':
            return self.alpha * step_direction(grad, 'linf', mask)
        scale = self.budget_scale(mask)
        delta = self.alpha * scale * step_direction(grad, 'l2', mask)
        if start is not None:
            delta = start + delta
        delta = delta * (self.eps * scale / l2_norms(delta).clamp_min(1e-12)).clamp(max=1.)
        return torch.where(finite, delta, torch.zeros_like(delta))

    def random_start_noise(self, shape: torch.Size, mask: torch.Tensor, it: int) -> torch.Tensor:
        """ε · n / ‖n‖₂ per image (n Gaussian over the valid area): a point on the ε-sphere."""
        state = np.random.SeedSequence([self.seed, it, get_rank()]).generate_state(1)[0]
        gen = torch.Generator().manual_seed(int(state))
        noise = torch.randn(shape, generator=gen).to(mask.device) * mask
        noise = noise / noise.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, 1, 1, 1)
        return noise * self.eps * self.budget_scale(mask)

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
        start, loss = None, None
        self._batch_nonfinite = 0
        if self.alpha == 0 or self.eps == 0:  # NOTE: the VQ round trip alone: no attack pass
            delta = torch.zeros_like(pixels)
        else:
            probe = x_hat
            if self.takes_random_start(it):
                # the reference: x0 = clamp(x̂ + ε n/‖n‖), the gradient at x0, δ from x̂
                probe = (x_hat + self.random_start_noise(x.shape, mask, it)).clamp(0, 1)
                start = probe - x_hat
            grad, loss = self.input_gradient(space.from_pixels(probe).to(x.dtype), samples)
            with torch.no_grad():
                delta = self.perturbation(space.grad_to_pixels(grad), mask, start)
            if self._batch_nonfinite:
                print_log(f'DAT: {self._batch_nonfinite} image(s) had a non-finite attack '
                          f'gradient at iteration {it} (fp16 overflow?) and were not attacked; '
                          f'{self.skipped_nonfinite} so far', logger='current',
                          level=logging.WARNING)
        with torch.no_grad():
            base = x_hat if self.requantize == 'reconstruction' else pixels
            x_adv, adv_codes = self.quantize((base + delta).clamp(0, 1))
            x_adv = torch.where(mask, x_adv, pixels)
            adv = space.from_pixels(x_adv).to(x.dtype)
        self.last_stats = dict(
            **({} if loss is None else {'dat_loss': loss}),
            dat_nonfinite=float(self._batch_nonfinite),
            dat_random_start=float(start is not None),
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
