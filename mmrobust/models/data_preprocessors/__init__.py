"""The pixel space behind a data preprocessor, for attacks and DAT."""
from .pixel_space import PixelSpace, patch_forward, patched_forward, perturb_in_pixels, valid_mask

__all__ = ['PixelSpace', 'patch_forward', 'patched_forward', 'perturb_in_pixels', 'valid_mask']
