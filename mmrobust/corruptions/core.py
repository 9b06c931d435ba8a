"""``corrupt()``: one corruption at one severity on one image, and per-image seed derivation."""
import hashlib
from typing import Union

import cv2
import numpy as np

from ..utils.errors import MMRobustError
from .protocols import SEVERITIES, get_corruption

#: Smallest supported side. Below it several corruptions are meaningless (a 17x17 defocus disk,
#: 2-4 px glass shuffles); the reference itself refuses images under 32 px.
MIN_SIZE = 8

SeedLike = Union[int, np.integer, np.random.RandomState, None]


class ImageTooSmallError(MMRobustError, ValueError):
    """An image under :data:`MIN_SIZE` px a side: the corruptions are not defined on it."""


def derive_seed(seed: int, image_id: Union[str, int], corruption: str, severity: int) -> int:
    """Seed of one image in one cell, from the global seed, a stable image id and the cell.

    A hash (not an RNG stream shared across images) so that every image's corruption is the same
    whatever the worker count, the processing order or the subset being generated.
    """
    key = f'{int(seed)}\x1f{image_id}\x1f{corruption}\x1f{int(severity)}'.encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), 'little')


def _rng(seed: SeedLike) -> np.random.RandomState:
    if isinstance(seed, np.random.RandomState):
        return seed
    # NOTE: a legacy RandomState, not a Generator: with seed k it draws what the reference draws
    # after np.random.seed(k), while leaving NumPy's global state alone.
    return np.random.RandomState(None if seed is None else int(seed) % (2 ** 32))


def corrupt(img: np.ndarray, name: str, severity: int, seed: SeedLike = None,
            channel_order: str = 'rgb') -> np.ndarray:
    """Apply corruption ``name`` at ``severity`` (1–5) to a uint8 image.

    Args:
        img: uint8 array, HxW, HxWx1, HxWx3 or HxWx4 (alpha is passed through unchanged).
        name: corruption name (see :data:`mmrobust.corruptions.CORRUPTIONS`).
        severity: 1..5.
        seed: int seed (``seed=k`` reproduces ``imagecorruptions`` after ``np.random.seed(k)``),
            a ``RandomState`` to draw from, or None for fresh entropy. NumPy's global RNG is never
            used.
        channel_order: ``'rgb'`` or ``'bgr'``: the order of ``img``'s colour channels. The
            corruptions are defined on RGB (snow, frost, spatter, saturate... are colour-aware);
            BGR input is swapped to RGB and back.

    Returns:
        The corrupted image, uint8, same shape as ``img``. Grey images are corrupted as RGB (so
        noise statistics match the reference) and converted back with the BT.601 luma.
    """
    info = get_corruption(name)
    if not isinstance(img, np.ndarray) or img.dtype != np.uint8:
        dtype = getattr(img, 'dtype', None)
        raise TypeError(f'corrupt() expects a uint8 numpy array, got {type(img).__name__}'
                        + (f' of dtype {dtype}' if dtype is not None else '') + '. Load images '
                        'with mmcv.imread or np.asarray(pil_image); convert 16-bit images with '
                        '(img >> 8).astype(np.uint8) and floats in [0, 1] with '
                        '(np.clip(img, 0, 1) * 255).round().astype(np.uint8).')
    if img.ndim not in (2, 3) or (img.ndim == 3 and img.shape[2] not in (1, 3, 4)):
        raise ValueError(f'corrupt() expects an HxW, HxWx1, HxWx3 or HxWx4 image, got shape '
                         f'{img.shape}.')
    if min(img.shape[:2]) < MIN_SIZE:
        raise ImageTooSmallError(f'Image of {img.shape[1]}x{img.shape[0]} px is too small to '
                                 f'corrupt: both sides must be at least {MIN_SIZE} px.')
    if severity not in SEVERITIES or isinstance(severity, bool):
        raise ValueError(f'Severity must be an integer in 1..5, got {severity!r}.')
    if channel_order not in ('rgb', 'bgr'):
        raise ValueError(f"channel_order must be 'rgb' or 'bgr', got {channel_order!r}.")

    channels = 1 if img.ndim == 2 else img.shape[2]
    if channels == 1:
        rgb = np.repeat(img.reshape(img.shape[0], img.shape[1], 1), 3, axis=2)
    else:
        rgb = img[..., :3]
        if channel_order == 'bgr':
            rgb = rgb[..., ::-1]
        rgb = np.ascontiguousarray(rgb)

    out = info.fn(rgb, int(severity), _rng(seed))
    out = np.ascontiguousarray(out, dtype=np.uint8)

    if channels == 1:
        return cv2.cvtColor(out, cv2.COLOR_RGB2GRAY).reshape(img.shape)
    if channel_order == 'bgr':
        out = out[..., ::-1]
    if channels == 4:
        return np.ascontiguousarray(np.concatenate([out, img[..., 3:]], axis=2))
    return np.ascontiguousarray(out)
