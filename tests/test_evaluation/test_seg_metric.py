"""FastIoUMetric gives mmseg's IoUMetric numbers exactly (integer counts).

For every map a segmentor and a dataset can produce, and robustness runs use it in place of
IoUMetric.
"""
import pytest
import torch
from mmseg.evaluation import IoUMetric

from mmrobust.evaluation.evaluator_cfg import use_fast_iou
from mmrobust.evaluation.seg_metric import FastIoUMetric, confusion_areas


def _maps(case: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    label = torch.randint(0, 19, (96, 128), generator=g)
    pred = torch.randint(0, 19, (96, 128), generator=g)
    if case in ('ignore', 'out-of-range'):
        label[torch.rand(96, 128, generator=g) < 0.2] = 255
    if case == 'out-of-range':  # labels a dataset should not have, counted as mmseg counts them
        label[:3] = 19
        label[3:5] = -1
    if case == 'label-equals-classes':  # no -1: the value a bincount row would collide with
        label[:3] = 19
    if case == 'all-ignored':
        label[:] = 255
    return pred, label


@pytest.mark.parametrize('case', ['plain', 'ignore', 'out-of-range', 'label-equals-classes',
                                  'all-ignored'])
def test_areas_equal_mmsegs(case):
    pred, label = _maps(case)
    expected = IoUMetric.intersect_and_union(pred, label, 19, 255)
    for got, want in zip(confusion_areas(pred, label, 19, 255), expected):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_label_equal_to_num_classes_counts_its_prediction():
    # the case: the pixel labelled 4 (= C, not ignored) keeps its prediction 3 in the
    # prediction and union areas, as mmseg's histc counts it
    pred = torch.tensor([0, 1, 2, 3, 1, 2])
    label = torch.tensor([0, 1, 2, 4, 255, 4])
    intersect, union, area_pred, area_label = confusion_areas(pred, label, 4, 255)
    assert area_pred.tolist() == union.tolist() == [1, 1, 2, 1]
    assert intersect.tolist() == area_label.tolist() == [1, 1, 1, 0]
    for got, want in zip((intersect, union, area_pred, area_label),
                         IoUMetric.intersect_and_union(pred, label, 4, 255)):
        assert torch.equal(got, want)


def test_metric_equals_iou_metric():
    samples = []
    for seed in range(4):
        pred, label = _maps('ignore', seed)
        samples.append({'pred_sem_seg': {'data': pred[None]}, 'gt_sem_seg': {'data': label[None]}})
    out = []
    for kind in (IoUMetric, FastIoUMetric):
        metric = kind(iou_metrics=['mIoU', 'mDice'])
        metric.dataset_meta = dict(classes=[str(i) for i in range(19)])
        metric.process({}, samples)
        out.append(metric.evaluate(len(samples)))
    assert out[0] == out[1] and out[0]['mIoU'] > 0


def test_robustness_runs_replace_iou_metric():
    evaluator, count = use_fast_iou([dict(type='IoUMetric', iou_metrics=['mIoU']),
                                     dict(type='CityscapesMetric')])
    assert count == 1 and evaluator[0] == dict(type='FastIoUMetric', iou_metrics=['mIoU'])
    assert evaluator[1] == dict(type='CityscapesMetric')
