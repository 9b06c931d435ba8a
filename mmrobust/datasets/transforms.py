"""Data transforms of mmrobust (registered for both mmdet and mmseg pipelines)."""
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import mmdet.datasets.transforms  # noqa: F401  (registers mmdet's Corrupt first; see below)
import numpy as np
from mmcv.transforms import BaseTransform
from typing_extensions import override

from ..corruptions import SEVERITIES, corrupt, derive_seed, get_corruption
from ..registry import TRANSFORMS
from ..utils.errors import ConfigError

_TOLD: list = []


def _say_replaced_once() -> None:
    """Log, once per process, that ``Corrupt`` is mmrobust's, not mmdet's colour handling."""
    if _TOLD:
        return
    _TOLD.append(True)
    from mmengine.logging import print_log
    print_log("Corrupt is mmrobust's (`import mmrobust` registers it over mmdet's): it corrupts "
              "the image in its real colour order, while mmdet's own Corrupt, behind mmdet's "
              "published COCO-C numbers, treated mmcv's BGR array as RGB. Pass "
              'bgr_compat=True (tools/test_robustness.py --bgr-compat) to corrupt as mmdet '
              'did, or bgr_compat=False to say that this is meant.', logger='current', level=30)


def _as_file_bytes(img: Any) -> Tuple[np.ndarray, Optional[np.dtype]]:
    """The uint8 image a loading step read, and the float dtype it converted it to (or None).

    ``LoadImageFromFile(to_float32=True)`` (mmdet's Mask2Former, CornerNet, CenterNet configs,
    several of mmseg's) hands on the file's uint8 values as float32: they are corrupted as the
    bytes they are and converted back.

    Raises:
        ConfigError: a float image that is not whole values in [0, 255] (not a loaded file), or
            another dtype (a 16-bit image, ``color_type='unchanged'``): the corruptions are
            defined on 8-bit images.
    """
    if not isinstance(img, np.ndarray) or img.dtype == np.uint8:
        return img, None
    if img.dtype.kind == 'f':
        whole = np.rint(img)
        if img.size and (whole.min() < 0 or whole.max() > 255 or not np.array_equal(whole, img)):
            raise ConfigError(
                f'Corrupt got a {img.dtype} image that is not whole values in [0, 255] (from '
                f'{float(img.min()):g} to {float(img.max()):g}): put it right after the '
                'image-loading step, before any normalisation')
        return whole.astype(np.uint8), img.dtype
    raise ConfigError(
        f'Corrupt got a {img.dtype} image: the corruptions are defined on 8-bit images. Load '
        "them as 8-bit (the loading step's color_type='color', not 'unchanged' for 16-bit "
        'files) or convert the set to 8-bit first')


# NOTE: mmdet ships a `Corrupt` (imagecorruptions, unseeded, crashes on current scikit-image for
# glass/gaussian blur). This one takes the same arguments and replaces it in the mmdet scope, so
# `dict(type='Corrupt', ...)` means the same transform in mmdet and mmseg configs.
@TRANSFORMS.register_module(force=True)
class Corrupt(BaseTransform):
    """Corrupt ``results['img']`` with one corruption at one severity (on-the-fly COCO-C etc.).

    Place it right after the image-loading step. It replaces mmdet's ``Corrupt`` (same
    ``corruption``/``severity`` arguments); ``bgr_compat=True`` reproduces mmdet's colour
    handling. The corruption of every image is seeded from
    (``seed``, the image's file name, corruption, severity), the same scheme as
    ``tools/make_corrupted.py``, so on-the-fly and stored corrupted sets are identical.

    Args:
        corruption: a corruption name (``gaussian_noise``, ... see ``mmrobust.corruptions``).
        severity: 1..5.
        seed: global seed of the corrupted set.
        channel_order: colour order of ``results['img']``: ``'bgr'`` for mmcv's loaders
            (default), ``'rgb'`` for loaders configured with ``channel_order='rgb'``.
        bgr_compat: corrupt the array as if it were RGB whatever its order, which reproduces
            mmdet's historical (BGR) COCO-C numbers. Not given: False, and the log says once
            that this is not mmdet's colour handling.
    """

    def __init__(self, corruption: str, severity: int = 1, seed: int = 0,
                 channel_order: str = 'bgr', bgr_compat: Optional[bool] = None) -> None:
        self.corruption = get_corruption(corruption).name
        if severity not in SEVERITIES:
            raise ValueError(f'Corrupt: severity must be in 1..5, got {severity!r}.')
        if channel_order not in ('bgr', 'rgb'):
            raise ValueError(f"Corrupt: channel_order must be 'bgr' or 'rgb', got "
                             f'{channel_order!r}.')
        self.severity = int(severity)
        self.seed = int(seed)
        self.channel_order = channel_order
        if bgr_compat is None:  # NOTE: e.g. mmdet's own test_robustness.py, which builds it by
            _say_replaced_once()  # mmdet's name and arguments
        self.bgr_compat = bool(bgr_compat)

    @staticmethod
    def image_id(results: Dict) -> str:
        """The id an image is seeded by: its file name (as in the dataset generator)."""
        path: Optional[str] = results.get('img_path')
        if path:
            return Path(path).name
        if 'img_id' in results:
            return str(results['img_id'])
        if 'sample_idx' in results:
            return str(results['sample_idx'])
        raise ConfigError('Corrupt needs img_path, img_id or sample_idx in the results to seed the '
                          'corruption per image; put it after LoadImageFromFile.')

    @override
    def transform(self, results: Dict) -> Dict:
        if 'img' not in results:
            raise ConfigError('Corrupt found no image in the results: put it right after the '
                              'image-loading transform (e.g. LoadImageFromFile).')
        seed = derive_seed(self.seed, self.image_id(results), self.corruption, self.severity)
        order = 'rgb' if self.bgr_compat else self.channel_order
        img, dtype = _as_file_bytes(results['img'])
        out = corrupt(img, self.corruption, self.severity, seed=seed, channel_order=order)
        # NOTE: handed on as the loading step gave it (to_float32: float32 in [0, 255]), so a
        # cell differs from the clean set by the corruption only
        results['img'] = out if dtype is None else out.astype(dtype)
        results.setdefault('corruption', (self.corruption, self.severity))
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(corruption={self.corruption!r}, '
                f'severity={self.severity}, seed={self.seed}, '
                f'channel_order={self.channel_order!r}, bgr_compat={self.bgr_compat})')


#: The key of a sample's data info that names its robustness cell, ``(corruption, severity)``.
CELL_KEY = 'robustness_cell'


@TRANSFORMS.register_module()
class CorruptCell(BaseTransform):
    """``Corrupt`` by the cell a sample carries (``results[CELL_KEY]``; none: left clean).

    The one-pass robustness loop builds the test dataset once, with this step where ``Corrupt``
    would go, and hands every sample its cell as data, so the dataloader workers serve every cell
    of a protocol. Each cell's images are those of ``Corrupt(corruption, severity, seed, ...)``
    (the same seeds, the same bytes).

    Args:
        seed, channel_order, bgr_compat: as ``Corrupt``'s, for every cell.
    """

    def __init__(self, seed: int = 0, channel_order: str = 'bgr',
                 bgr_compat: bool = False) -> None:
        self.seed, self.channel_order, self.bgr_compat = int(seed), channel_order, bgr_compat
        self._steps: Dict[tuple, Corrupt] = {}

    @override
    def transform(self, results: Dict) -> Dict:
        cell = results.pop(CELL_KEY, None)
        if cell is None:
            return results
        corruption, severity = cell
        if (corruption, severity) not in self._steps:
            self._steps[corruption, severity] = Corrupt(
                corruption, severity, seed=self.seed, channel_order=self.channel_order,
                bgr_compat=self.bgr_compat)
        return self._steps[corruption, severity].transform(results)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(seed={self.seed}, '
                f'channel_order={self.channel_order!r}, bgr_compat={self.bgr_compat})')


@TRANSFORMS.register_module()
class StoredCell(BaseTransform):
    """Read a stored corrupted set's copy of the image.

    ``img_path`` moved from the clean set's ``data_root`` into ``<root>/<corruption>/<severity>/``
    (``make_corrupted.py``'s layout).

    The per-cell robustness loop puts it before the image-loading step of each test dataset,
    so every sample is mapped however its path was formed (``data_root``, a relative or
    absolute ``data_prefix``, paths in the annotation file); a path outside ``data_root`` is
    an error, never a silent read of the clean image.

    Args:
        root: the stored set's root.
        corruption, severity: the cell.
        data_root: the clean dataset's ``data_root``.
    """

    def __init__(self, root: str, corruption: str, severity: int,
                 data_root: Optional[str]) -> None:
        self.root, self.corruption, self.severity = str(root), corruption, int(severity)
        self.data_root = data_root

    @override
    def transform(self, results: Dict) -> Dict:
        from ..corruptions.stored import cell_image_path
        results['img_path'] = cell_image_path(results['img_path'], self.data_root, self.root,
                                              self.corruption, self.severity)
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(root={self.root!r}, corruption={self.corruption!r}, '
                f'severity={self.severity}, data_root={self.data_root!r})')
