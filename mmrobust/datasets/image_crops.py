"""Unlabelled images of a detection / segmentation dataset, as crops for tokenizer training.

:func:`dataset_image_paths` lists the images of any mmdet / mmseg config's dataset without
reading labels; :class:`ImageCrops` serves square crops of them at the scale models see them.
"""
import random
from typing import List, Optional, Sequence

import cv2
import numpy as np
import torch
from mmengine.config import Config

from ..registry import DATASETS
from ..utils.config_checks import check_dataset_paths, config_scope
from ..utils.errors import InputNotFoundError

__all__ = ['ImageCrops', 'ImageCropsDataset', 'dataset_image_paths']


class ImageCrops(torch.utils.data.Dataset):
    """Square crops, in [0, 1] RGB, of a dataset's images at about the scale models see them.

    Training crops: the image rescaled by a random factor of ``scale_range`` (relative to its
    file's size), a random position, a random horizontal flip. Evaluation crops
    (``train=False``): rescaled by the middle of ``scale_range``, central. An image smaller than
    the crop at that scale is enlarged to fit.

    NOTE: the crops keep the image's own scale rather than shrinking the whole image to the crop
    size: a tokenizer trained on thumbnails learns far denser detail than it meets on the
    full-size images that detectors and DAT feed it.
    """

    def __init__(self, paths: List[str], size: int, train: bool,
                 scale_range: Sequence[float] = (0.5, 1.0)) -> None:
        if not paths:
            raise InputNotFoundError('the dataset has no images')
        if len(scale_range) != 2 or not 0 < scale_range[0] <= scale_range[1]:
            raise ValueError(f'scale_range must be (low, high) with 0 < low <= high, got '
                             f'{scale_range}')
        self.paths, self.size, self.train = paths, size, train
        self.scale_range = tuple(float(s) for s in scale_range)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> torch.Tensor:
        img = cv2.imread(self.paths[index], cv2.IMREAD_COLOR)
        if img is None:
            raise OSError(f'cannot read image {self.paths[index]}')
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        h, w = img.shape[:2]
        low, high = self.scale_range
        scale = random.uniform(low, high) if self.train else (low + high) / 2
        scale = max(scale, self.size / min(h, w))
        if scale != 1:
            img = cv2.resize(img, (max(self.size, round(w * scale)),
                                   max(self.size, round(h * scale))),
                             interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
        h, w = img.shape[:2]
        top = random.randint(0, h - self.size) if self.train else (h - self.size) // 2
        left = random.randint(0, w - self.size) if self.train else (w - self.size) // 2
        img = img[top:top + self.size, left:left + self.size]
        if self.train and random.random() < 0.5:
            img = img[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float() / 255


def dataset_image_paths(config: str, loader: str) -> List[str]:
    """Paths of the images of ``loader``'s dataset in an mmdet/mmseg config (no labels read)."""
    from mmengine.registry import DefaultScope

    # NOTE: mmrobust's datasets and transforms are registered: importing this module imported
    # the mmrobust package first
    cfg = Config.fromfile(config)
    scope = config_scope(cfg)
    check_dataset_paths(cfg, [loader])
    registry = __import__(f'{scope}.registry', fromlist=['DATASETS']).DATASETS
    dataset_cfg = cfg[loader]['dataset']
    dataset_cfg = dict(dataset_cfg, pipeline=[])
    dataset_cfg.pop('filter_cfg', None)
    # NOTE: the dataset config's scope for this build only: a Runner building a tokenizer
    # trainer from another config keeps its own
    with DefaultScope.overwrite_default_scope(scope):
        dataset = registry.build(dataset_cfg)
    return [dataset.get_data_info(i)['img_path'] for i in range(len(dataset))]


@DATASETS.register_module()
class ImageCropsDataset(ImageCrops):
    """:class:`ImageCrops` of the images of another config's dataset.

    An mmengine dataset (items ``dict(inputs=image)``) for tokenizer training with the Runner.

    Args:
        config: an mmdet / mmseg config whose dataset supplies the images (labels unread).
        loader: which of its dataloaders (``'train_dataloader'``, ``'val_dataloader'``...).
        crop_size: side of the square crops.
        train: random crops (scale, position, flip) or central evaluation crops.
        scale_range: crop scale relative to the files' size.
        max_images: the first N images only (e.g. a fixed held-out set).
    """

    def __init__(self, config: str, loader: str, crop_size: int, train: bool = True,
                 scale_range: Sequence[float] = (0.5, 1.0), max_images: Optional[int] = None
                 ) -> None:
        paths = dataset_image_paths(config, loader)
        super().__init__(paths[:max_images], crop_size, train, scale_range)
        self.metainfo = {'source': f'{config}:{loader}'}

    def __getitem__(self, index: int) -> dict:
        return {'inputs': super().__getitem__(index)}
