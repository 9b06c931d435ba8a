"""The losses the attacks ascend: a detector's training loss, a segmentor's scored cross-entropy.

For detectors, the model's own training loss on the test set's ground truth (every mmdet
detector's loss, its boxes and masks at the input's scale). For segmentors, the per-pixel
cross-entropy of the predictor the config scores: mmseg's ``inference`` with the config's
``test_cfg`` (slide windows or the whole image), the padding cropped, a test-time flip undone and
resized to the label, as ``postprocess_result`` does before the metric; slide inference is
differentiated window by window (:class:`_SlideLogits`): the peak memory of one window, not of
all of them. A family's ``pixel_weight`` (SegPGD's, CosPGD's) reweights that cross-entropy.
"""
import copy
from contextlib import contextmanager
from typing import Any, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.structures import PixelData

from ..utils.errors import MMRobustError, UsageError
from .attack_families import ATTACK_FAMILIES

__all__ = ['AttackError', 'AttackLossError', 'check_ground_truth', 'gt_at_input_scale',
           'is_segmentor', 'objective', 'samples_for_loss', 'seg_loss', 'task_loss']


class AttackError(UsageError):
    """An attack that cannot run as asked.

    Its name, budget or settings are wrong, or the model or test pipeline is one it does not apply
    to (exit status 2).
    """


class AttackLossError(MMRobustError, RuntimeError):
    """The training loss the detector's attack ascends failed on the test data.

    The model's training loss, which the detector's attack ascends, failed on the test data (exit
    status 1): the message says what the loss needs; ``--debug`` shows where it failed.
    """


def is_segmentor(model: nn.Module) -> bool:
    """Whether a model is an mmseg segmentor (it has a decode head)."""
    return hasattr(model, 'decode_head')


def check_ground_truth(model: nn.Module, samples: Optional[Sequence]) -> None:
    """Every sample has the ground truth the model's loss reads (else: how to load it)."""
    seg = is_segmentor(model)
    key, fix = (('gt_sem_seg', "dict(type='LoadAnnotations') before PackSegInputs") if seg else
                ('gt_instances', "dict(type='LoadAnnotations', with_bbox=True) (with_mask=True "
                 'for instance segmentation) before PackDetInputs'))
    if not samples or any(key not in s for s in samples):
        raise AttackError(
            f'the attack ascends the model\'s training loss, which needs the ground truth '
            f'({key}) in the test data, and the test batches have none: add {fix} to '
            'test_dataloader.dataset.pipeline')


def _label_map_at(seg: PixelData, size: Tuple[int, int]) -> PixelData:
    """A label map resized to ``size`` (nearest: labels stay labels), metainfo kept."""
    out = PixelData(metainfo=seg.metainfo)
    for key in seg.keys():
        value = seg.get(key)
        out.set_field(F.interpolate(value[None].float(), size=size, mode='nearest')[0]
                      .to(value.dtype), key)
    return out


def gt_at_input_scale(samples: Sequence) -> List:
    """Detection samples with their ground truth rescaled to the input's scale.

    Copies of detection samples whose ground truth, loaded at the file's scale (mmdet's test
    pipelines load annotations after Resize), is brought to the network input's scale.
    """
    out = []
    for sample in samples:
        sample = copy.deepcopy(sample)  # NOTE: clone() shares the boxes, rescaled in place
        w_scale, h_scale = sample.metainfo.get('scale_factor', (1.0, 1.0))
        if (w_scale, h_scale) != (1.0, 1.0):
            # NOTE: the crowd boxes too: the losses' assigners ignore proposals by them
            for key in ('gt_instances', 'ignored_instances'):
                if key not in sample:
                    continue
                gt = sample.get(key)
                if 'bboxes' in gt:
                    boxes = gt.bboxes
                    if torch.is_tensor(boxes):
                        gt.bboxes = boxes * boxes.new_tensor([w_scale, h_scale] * 2)
                    else:  # NOTE: mmdet's box types
                        boxes.rescale_((w_scale, h_scale))
                if 'masks' in gt:
                    gt.masks = gt.masks.resize(tuple(sample.metainfo['img_shape'][:2]))
            if 'gt_sem_seg' in sample:  # NOTE: a panoptic set's label map (stuff and things)
                sample.gt_sem_seg = _label_map_at(sample.gt_sem_seg,
                                                  tuple(sample.metainfo['img_shape'][:2]))
        out.append(sample)
    return out


def _slide_windows(test_cfg: Mapping, height: int, width: int) -> List[Tuple[int, int, int, int]]:
    """mmseg's slide windows ``(y1, y2, x1, x2)``.

    Every ``stride``, the last flush with the edge, no window larger than the image
    (``EncoderDecoder.slide_inference``).
    """
    (h_stride, w_stride), (h_crop, w_crop) = test_cfg['stride'], test_cfg['crop_size']
    rows = max(height - h_crop + h_stride - 1, 0) // h_stride + 1
    cols = max(width - w_crop + w_stride - 1, 0) // w_stride + 1
    windows = []
    for r in range(rows):
        for c in range(cols):
            y2, x2 = min(r * h_stride + h_crop, height), min(c * w_stride + w_crop, width)
            windows.append((max(y2 - h_crop, 0), y2, max(x2 - w_crop, 0), x2))
    return windows


class _SlideLogits(torch.autograd.Function):
    """mmseg's slide inference whose backward pass holds one window at a time.

    Autograd through ``slide_inference`` keeps every window's activations until the backward
    pass: more memory than the whole image (the windows overlap). Here the forward pass runs
    without a graph, and the backward pass runs each window again and sends back its share of
    the output gradient (divided by the overlap count, as the average does): the same
    gradient, at the peak memory of one window, for one more forward pass per window.
    """

    @staticmethod
    def forward(ctx, inputs: torch.Tensor, model: nn.Module, metas: List[dict]) -> torch.Tensor:
        ctx.model, ctx.metas = model, metas
        ctx.save_for_backward(inputs)
        with torch.no_grad():
            return model.slide_inference(inputs, [dict(m) for m in metas])

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        inputs, = ctx.saved_tensors
        model = ctx.model
        windows = _slide_windows(model.test_cfg, *inputs.shape[-2:])
        count = inputs.new_zeros((1, 1, *inputs.shape[-2:]))
        for y1, y2, x1, x2 in windows:
            count[..., y1:y2, x1:x2] += 1
        grad_in = torch.zeros_like(inputs)
        for y1, y2, x1, x2 in windows:
            crop = inputs[:, :, y1:y2, x1:x2].detach().requires_grad_(True)
            metas = [dict(m, img_shape=crop.shape[2:]) for m in ctx.metas]
            with torch.enable_grad():
                scores = model.encode_decode(crop, metas)
                share = grad_out[:, :, y1:y2, x1:x2] / count[..., y1:y2, x1:x2]
                grad, = torch.autograd.grad(scores, crop, share.to(scores.dtype))
            grad_in[:, :, y1:y2, x1:x2] += grad
        return grad_in, None, None


def _scored_logits(model: nn.Module, inputs: torch.Tensor, samples: Sequence
                   ) -> List[torch.Tensor]:
    """Each image's (1, C, H, W) class scores as the config's predictor scores them.

    mmseg's ``model.inference`` (slide windows or the whole image, as ``test_cfg`` says), the
    padding cropped, a test-time flip undone and resized to the label's size, as
    ``postprocess_result`` does before the metric takes the argmax.
    """
    if not callable(getattr(model, 'inference', None)):
        raise AttackError(f'{type(model).__name__} has no inference(inputs, img_metas): the '
                          'attacks differentiate the predictor that is scored, an mmseg '
                          'EncoderDecoder\'s (whole or slide test_cfg)')
    # NOTE: slide inference writes each window's shape into the first meta: give it copies
    metas = [dict(s.metainfo) for s in samples]
    if (getattr(model, 'test_cfg', None) or {}).get('mode', 'whole') == 'slide':
        logits = _SlideLogits.apply(inputs, model, metas)
    else:
        logits = model.inference(inputs, metas)
    align = getattr(model, 'align_corners', model.decode_head.align_corners)
    height, width = logits.shape[-2:]
    out = []
    for i, sample in enumerate(samples):
        meta = sample.metainfo
        left, right, top, bottom = meta.get('img_padding_size',
                                            meta.get('padding_size', (0, 0, 0, 0)))
        part = logits[i:i + 1, :, top:height - bottom, left:width - right]
        if meta.get('flip'):
            part = part.flip(dims=(3,) if meta.get('flip_direction') == 'horizontal' else (2,))
        out.append(F.interpolate(part, size=tuple(sample.gt_sem_seg.data.shape[-2:]),
                                 mode='bilinear', align_corners=align))
    return out


def _per_pixel_ce(model: nn.Module, inputs: torch.Tensor, samples: Sequence
                  ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(per-pixel cross-entropy, logits, labels) of the scored predictor at the labels' resolution.

    One image: the attacks run per image. Ignored pixels have label -1, loss 0.
    """
    ignore = getattr(model.decode_head, 'ignore_index', 255)
    losses, kept_logits, labels = [], [], []
    for sample, part in zip(samples, _scored_logits(model, inputs, samples)):
        label = sample.gt_sem_seg.data.to(inputs.device).long()[0]
        label = torch.where(label == ignore, torch.full_like(label, -1), label)
        losses.append(F.cross_entropy(part, label[None], ignore_index=-1, reduction='none')[0])
        kept_logits.append(part[0])
        labels.append(label)
    return torch.stack(losses), torch.stack(kept_logits), torch.stack(labels)


def seg_loss(name: str, model: nn.Module, inputs: torch.Tensor, samples: Sequence,
             step: Optional[int], steps: int) -> torch.Tensor:
    """The mean per-pixel cross-entropy of the scored predictor over the labelled pixels.

    Plain (FGSM, PGD, and every attack's final loss: ``step`` None), or weighted per pixel by
    the ``pixel_weight`` of family ``name`` (SegPGD's, CosPGD's) at iteration ``step`` (from 0)
    of ``steps``.
    """
    family = ATTACK_FAMILIES[name]
    ce, logits, labels = _per_pixel_ce(model, inputs, samples)
    valid = labels >= 0
    count = valid.sum().clamp_min(1)
    if step is None or family.pixel_weight is None:
        return (ce * valid).sum() / count
    with torch.no_grad():
        weight = family.pixel_weight(logits, labels, step, steps)
    return (ce * weight * valid).sum() / count


#: layers whose training mode changes what they compute: kept in eval mode for the attack's loss
_EVAL_LAYERS = (nn.modules.batchnorm._NormBase, nn.modules.dropout._DropoutNd)


@contextmanager
def loss_branches(model: nn.Module) -> Iterator[None]:
    """The model's training branches on, its normalisation and dropout layers as they are.

    A detector builds what its ``loss()`` reads where ``self.training`` is set: DINO's and
    Deformable DETR's encoder outputs and denoising queries, DDQ-DETR's and Grounding DINO's
    likewise. Its batch statistics and dropout masks stay those of inference (eval mode), so the
    attack ascends the loss of the model it evaluates.
    """
    flags = {m: m.training for m in model.modules()}
    for module in model.modules():
        keep = isinstance(module, _EVAL_LAYERS) or 'Drop' in type(module).__name__
        module.training = module.training if keep else True
    try:
        yield
    finally:
        for module, flag in flags.items():
            module.training = flag


def _own_instances(samples: Sequence) -> List:
    """Shallow copies whose instance fields a head may reassign, the originals untouched.

    RTMDet-Ins's loss turns its ground-truth masks into a tensor in place; an attack computes
    the loss once per step from the same samples.
    """
    out = []
    for sample in samples:
        sample = copy.copy(sample)
        for key in ('gt_instances', 'ignored_instances'):
            if key in sample:
                setattr(sample, key, copy.copy(sample.get(key)))
        out.append(sample)
    return out


def task_loss(model: nn.Module, inputs: torch.Tensor, samples: Sequence) -> torch.Tensor:
    """A detector's training loss on ``samples``' ground truth, summed as it trains.

    Computed as ``model.loss()`` builds it, within :func:`loss_branches`.
    """
    try:
        with loss_branches(model):
            losses = model(inputs, _own_instances(samples), mode='loss')
    except Exception as err:
        raise AttackLossError(
            f'the training loss of {type(model).__name__} could not be computed from the test '
            f'data ({type(err).__name__}: {err}). It needs the ground truth in the test pipeline '
            '(LoadAnnotations before the Pack step) and the model\'s train_cfg; where both are '
            'there, --debug shows where the loss failed') from err
    loss, _ = model.parse_losses(losses)
    return loss


def objective(attack: Any, model: nn.Module, inputs: torch.Tensor, samples: Sequence,
              step: Optional[int]) -> torch.Tensor:
    """The loss ``attack`` ascends at iteration ``step``.

    None: the final loss, by which restarts are compared. For segmentors the scored predictor's
    per-pixel cross-entropy (SegPGD / CosPGD weighted), for detectors their training loss.
    """
    if is_segmentor(model):
        return seg_loss(attack.name, model, inputs, samples, step, attack.steps)
    return task_loss(model, inputs, samples)


def samples_for_loss(model: nn.Module, samples: Sequence, gt_at_file_scale: bool) -> Sequence:
    """The samples the loss sees.

    Checked for ground truth, detection boxes and masks at the input's scale (on a copy).
    """
    check_ground_truth(model, samples)
    if gt_at_file_scale and not is_segmentor(model):
        return gt_at_input_scale(samples)
    return samples
