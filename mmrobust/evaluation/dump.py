"""The predictions a robustness run keeps (``--save-predictions``), compact.

mmengine's ``DumpResults`` pickles every data sample as the model returned it: a detector's
N x H x W instance masks (~30 MB per image at 100 masks of 640x480, ~150 GB per 5,000-image
COCO-C cell), a segmentor's ``seg_logits`` (19 x 1024 x 2048 float32, ~160 MB per Cityscapes
image), and the ground truth, all gathered to rank 0 and pickled again.
:class:`DumpRobustPredictions` keeps, on every rank before the gather, what mmdet's
``DumpDetResults`` keeps for detection (boxes, scores, labels, masks run-length encoded as COCO
does) and, for segmentation, the label map as uint8 (uint16 beyond 255 classes), without the
logits; the ground truth is not kept (it is in the dataset). Arrays are numpy, so a file loads
without torch.
"""
from typing import Any, Dict, Sequence

import numpy as np
from mmengine.evaluator import DumpResults
from typing_extensions import override

from ..registry import METRICS

__all__ = ['DROPPED_KEYS', 'DumpRobustPredictions', 'compact_sample']

#: What a kept sample leaves out: the ground truth (in the dataset) and the logits.
DROPPED_KEYS = ('gt_instances', 'ignored_instances', 'gt_panoptic_seg', 'gt_sem_seg',
                'seg_logits', 'gt_instances_3d')


def _numpy(value: Any) -> Any:
    import torch
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, dict):
        return {k: _numpy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_numpy(v) for v in value)
    return value


def _label_map(data: Any) -> np.ndarray:
    """A (1, H, W) or (H, W) label map as the smallest unsigned type that holds it."""
    labels = np.asarray(_numpy(data))
    if labels.size == 0:
        return labels.astype(np.uint8)
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high > np.iinfo(np.uint16).max:
        return labels  # NOTE: not a label map of classes; kept as it is
    return labels.astype(np.uint8 if high <= np.iinfo(np.uint8).max else np.uint16)


def compact_sample(sample: Dict[str, Any]) -> Dict[str, Any]:
    """One data sample (as ``Evaluator.process`` hands it, a dict) as the dump keeps it."""
    from .mask_rle import encode_masks
    out = {k: v for k, v in sample.items() if k not in DROPPED_KEYS}
    pred = out.get('pred_instances')
    if isinstance(pred, dict):
        pred = dict(pred)
        masks = pred.get('masks')
        if masks is not None and not isinstance(masks, list):
            pred['masks'] = encode_masks(masks)  # NOTE: as DumpDetResults: COCO's RLE
        out['pred_instances'] = pred
    sem = out.get('pred_sem_seg')
    if isinstance(sem, dict) and 'data' in sem:
        out['pred_sem_seg'] = {**sem, 'data': _label_map(sem['data'])}
    return _numpy(out)


@METRICS.register_module()
class DumpRobustPredictions(DumpResults):
    """mmengine's ``DumpResults`` (same ``out_file_path``) keeping each sample compact.

    :func:`compact_sample`.
    """

    @override
    def process(self, data_batch: Any, data_samples: Sequence[dict]) -> None:
        self.results.extend(compact_sample(sample) for sample in data_samples)
