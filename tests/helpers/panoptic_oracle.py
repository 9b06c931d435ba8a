"""A panoptic "model" whose quality depends on the image: the ground truth, where it can see it.

For the panoptic runs of the tests (:func:`helpers.zoo.tiny_coco_panoptic`): the tiny set paints
each thing as a flat colour on uniform noise, so a thing is visible where its pixels are flat.
:class:`PanopticOracle` predicts each image's ground-truth panoptic map, and gives every thing whose
pixels in the network input spread more than ``tolerance`` (pixel units; noise makes them) to the
stuff around it; a thing of fewer than ``min_pixels`` input pixels (mostly its edge, blended with
the noise by the resize) is always seen. Clean images score PQ 100; a noise corruption loses the
things, so its PQ is lower, by as much as the pixels the cell really fed the model say.

Registered in mmdet's ``MODELS`` on import (a config's ``custom_imports``).
"""
from typing import List, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmdet.evaluation.functional import INSTANCE_OFFSET
from mmdet.registry import MODELS
from mmengine.model import BaseModel
from mmengine.structures import PixelData


@MODELS.register_module()
class PanopticOracle(BaseModel):
    """The ground-truth panoptic map, less the things the image does not show flat."""

    def __init__(self, num_things: int = 80, num_classes: int = 133, tolerance: float = 12.0,
                 min_pixels: int = 64, data_preprocessor: Optional[dict] = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.num_things, self.num_classes = num_things, num_classes
        self.tolerance, self.min_pixels = tolerance, min_pixels
        # NOTE: a parameter, so that checkpoints and the strict load have a tensor to match
        self.unused = nn.Parameter(torch.zeros(()))

    def forward(self, inputs: torch.Tensor, data_samples: Optional[Sequence] = None,
                mode: str = 'tensor'):
        if mode != 'predict':
            raise RuntimeError(f'{type(self).__name__} only predicts (asked for {mode!r})')
        return [self._predict(image, sample) for image, sample in zip(inputs, data_samples)]

    def _visible(self, image: torch.Tensor, mask: torch.Tensor, shape: List[int]) -> bool:
        """Whether the thing's pixels are flat in the network input (median absolute deviation)."""
        h, w = shape
        at_input = F.interpolate(mask[None, None].float(), size=(h, w), mode='nearest')[0, 0] > 0
        pixels = image[:, :h, :w][:, at_input].float()
        if pixels.shape[1] < self.min_pixels:
            return True
        spread = (pixels - pixels.median(dim=1, keepdim=True).values).abs().median()
        return bool(spread <= self.tolerance)

    def _predict(self, image: torch.Tensor, sample):
        labels = sample.gt_sem_seg.sem_seg[0].long()  # file scale: loaded after Resize
        stuff = labels.clone()
        stuff[(labels < self.num_things) | (labels >= self.num_classes)] = -1
        # NOTE: the pixels of a lost thing go to the stuff class covering most of the image
        background = int(stuff[stuff >= 0].mode().values) if (stuff >= 0).any() \
            else self.num_classes
        pan = torch.where(labels >= self.num_classes, self.num_classes, labels)
        pan = torch.where((labels < self.num_things), background, pan)
        instances = sample.gt_instances
        masks = torch.as_tensor(instances.masks.to_ndarray()).bool()
        for k, (mask, label) in enumerate(zip(masks, instances.labels.tolist())):
            if self._visible(image, mask, sample.img_shape):
                pan[mask] = label + (k + 1) * INSTANCE_OFFSET
        sample.pred_panoptic_seg = PixelData(sem_seg=pan[None])
        return sample
