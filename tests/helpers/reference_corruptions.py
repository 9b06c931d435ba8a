"""The reference corruptions (``imagecorruptions`` 1.1.2), made to run on current scikit-image.

imagecorruptions calls ``skimage.filters.gaussian(..., multichannel=True)``, an argument removed
in scikit-image 0.20 (glass_blur and gaussian_blur crash). The shim swaps in a wrapper that maps
it to ``channel_axis=-1``; nothing else changes. Used by the fidelity tests and by
``tools/analysis_tools/benchmark_corruptions.py``; never by mmrobust itself.
"""
import numpy as np
import skimage.filters


def load_reference():
    """The patched ``imagecorruptions`` module."""
    import imagecorruptions
    import imagecorruptions.corruptions as module

    if getattr(module, '_mmrobust_shim', False):
        return imagecorruptions
    original = skimage.filters.gaussian

    def gaussian(image, sigma=1, multichannel=None, **kwargs):
        if multichannel:
            kwargs['channel_axis'] = -1
        return original(image, sigma=sigma, **kwargs)

    module.gaussian = gaussian
    module._mmrobust_shim = True
    return imagecorruptions


def reference_corrupt(img: np.ndarray, name: str, severity: int, seed: int) -> np.ndarray:
    """``imagecorruptions.corrupt`` after ``np.random.seed(seed)`` (global state restored)."""
    reference = load_reference()
    state = np.random.get_state()
    try:
        np.random.seed(seed)
        return reference.corrupt(img, severity, name)
    finally:
        np.random.set_state(state)
