"""The pixel space behind a data preprocessor, and hooking into its output.

Attacks (DAT) and perturbation studies change the batch a model sees *after* its data
preprocessor (normalisation, padding, batch augments), but measure their budgets in plain RGB
pixels in [0, 1] over each image's own area. :class:`PixelSpace` maps between the two,
:func:`valid_mask` marks each image's area, and :func:`patch_forward` makes a preprocessor
hand its output to a transform without changing its class or its state-dict keys.
"""
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Sequence, Tuple

import torch
import torch.nn as nn

__all__ = ['PixelSpace', 'valid_mask', 'patch_forward', 'patched_forward', 'perturb_in_pixels']

#: ``transform(preprocessed_batch, training) -> preprocessed_batch``
BatchTransform = Callable[[dict, bool], dict]
#: ``perturb(pixels, mask) -> pixels``, RGB in [0, 1], mask (B, 1, H, W) of each image's area
PixelPerturb = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class PixelSpace:
    """Maps a data preprocessor's output to RGB pixels in [0, 1] and back.

    Reads the preprocessor's normalisation (``mean``/``std`` in 0-255 units) and channel flip
    (mmengine/mmdet ``_channel_conversion``, mmseg ``channel_conversion``; images are loaded BGR,
    so a flip means the model sees RGB).

    Args:
        preprocessor: the model's data preprocessor.
        channel_order: of the preprocessed batch; ``'auto'`` reads the preprocessor's flip.
        pixel_max: the raw pixel range the preprocessor's mean/std refer to.
    """

    def __init__(self, preprocessor: nn.Module, channel_order: str = 'auto',
                 pixel_max: float = 255.) -> None:
        if getattr(preprocessor, '_enable_normalize', False):
            mean, std = preprocessor.mean.detach().float(), preprocessor.std.detach().float()
        else:
            mean, std = torch.zeros(3, 1, 1), torch.ones(3, 1, 1)
        if mean.numel() != 3:
            raise ValueError('the pixel space needs 3-channel images; the data preprocessor '
                             f'normalises {mean.numel()} channels')
        self.mean, self.std = mean.view(1, 3, 1, 1), std.view(1, 3, 1, 1)
        self.pixel_max = float(pixel_max)
        if channel_order == 'auto':
            flip = bool(getattr(preprocessor, '_channel_conversion',
                                getattr(preprocessor, 'channel_conversion', False)))
            channel_order = 'rgb' if flip else 'bgr'
        if channel_order not in ('rgb', 'bgr'):
            raise ValueError(f"channel_order must be 'auto', 'rgb' or 'bgr', got {channel_order!r}")
        self.bgr = channel_order == 'bgr'

    def to(self, device: torch.device) -> 'PixelSpace':
        """Move the mean and std to ``device`` (in place)."""
        self.mean, self.std = self.mean.to(device), self.std.to(device)
        return self

    def to_pixels(self, x: torch.Tensor) -> torch.Tensor:
        """Model input → RGB [0, 1] (float32)."""
        p = (x.float() * self.std + self.mean) / self.pixel_max
        return p.flip(1) if self.bgr else p

    def from_pixels(self, p: torch.Tensor) -> torch.Tensor:
        """RGB [0, 1] → model input."""
        p = p.flip(1) if self.bgr else p
        return (p * self.pixel_max - self.mean) / self.std

    def grad_to_pixels(self, g: torch.Tensor) -> torch.Tensor:
        """The gradient w.r.t. the model input expressed w.r.t. RGB [0, 1] pixels."""
        g = g.float() * self.pixel_max / self.std
        return g.flip(1) if self.bgr else g


def valid_mask(data_samples: Optional[Sequence], shape: Tuple[int, int, int, int],
               device: torch.device) -> torch.Tensor:
    """(B, 1, H, W) mask of the image area of each sample (padding excluded)."""
    b, _, h, w = shape
    mask = torch.zeros(b, 1, h, w, dtype=torch.bool, device=device)
    for i in range(b):
        ih, iw = h, w
        if data_samples is not None and 'img_shape' in data_samples[i]:
            ih, iw = data_samples[i].img_shape[:2]
        mask[i, :, :min(int(ih), h), :min(int(iw), w)] = True
    return mask


def perturb_in_pixels(space: PixelSpace, data: dict, perturb: PixelPerturb) -> dict:
    """A preprocessed batch with ``perturb`` applied to its images in pixel space.

    The padding keeps the values the preprocessor gave it.
    """
    x = data['inputs']
    mask = valid_mask(data.get('data_samples'), tuple(x.shape), x.device)
    pixels = space.to_pixels(x)
    new = torch.where(mask, perturb(pixels, mask), pixels)
    return dict(data, inputs=space.from_pixels(new).to(x.dtype))


def patch_forward(preprocessor: nn.Module, transform: BatchTransform) -> Callable[[], None]:
    """Make ``preprocessor(data, training)`` return ``transform(output, training)``.

    Returns the function that undoes it. The patch is an instance attribute, not a wrapper
    module, so the model's class, submodules and state-dict keys do not change.
    """
    if 'forward' in preprocessor.__dict__:
        raise RuntimeError(f'{type(preprocessor).__name__}.forward is patched already (by a '
                           'DAT hook or a perturbation study); undo that patch first')
    original = type(preprocessor).forward.__get__(preprocessor)

    def forward(data: dict, training: bool = False) -> dict:
        return transform(original(data, training), training)

    preprocessor.forward = forward

    def undo() -> None:
        preprocessor.__dict__.pop('forward', None)

    return undo


@contextmanager
def patched_forward(preprocessor: nn.Module, transform: BatchTransform) -> Iterator[None]:
    """:func:`patch_forward` for the duration of a ``with`` block."""
    undo = patch_forward(preprocessor, transform)
    try:
        yield
    finally:
        undo()
