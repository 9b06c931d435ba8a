"""Datasets and transforms: corruption cells, stored sets, shift sets, toy and synthetic data."""
from .image_crops import ImageCrops, ImageCropsDataset, dataset_image_paths
from .toy_data import (
    CITYSCAPES_CLASSES,
    CITYSCAPES_PALETTE,
    TOY_COCO_CLASSES,
    TOY_DATASETS,
    generate_toy_dataset,
    make_toy_cityscapes,
    make_toy_coco,
)
from .transforms import Corrupt, CorruptCell, StoredCell

__all__ = ['Corrupt', 'CorruptCell', 'StoredCell', 'CITYSCAPES_CLASSES', 'CITYSCAPES_PALETTE',
           'ImageCrops', 'ImageCropsDataset', 'TOY_COCO_CLASSES',
           'TOY_DATASETS', 'dataset_image_paths', 'generate_toy_dataset', 'make_toy_cityscapes',
           'make_toy_coco']
