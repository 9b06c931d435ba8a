from .transforms import Corrupt
from .toy_data import (CITYSCAPES_CLASSES, CITYSCAPES_PALETTE, TOY_COCO_CLASSES, TOY_DATASETS,
                       generate_toy_dataset, make_toy_cityscapes, make_toy_coco)

__all__ = ['Corrupt', 'CITYSCAPES_CLASSES', 'CITYSCAPES_PALETTE', 'TOY_COCO_CLASSES', 'TOY_DATASETS',
           'generate_toy_dataset', 'make_toy_cityscapes', 'make_toy_coco']
