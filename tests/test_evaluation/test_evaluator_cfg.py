"""Evaluator configs and test pipelines as a robustness run edits them (evaluator_cfg)."""
import pytest
from mmengine.config import Config
from mmseg.evaluation import IoUMetric

from mmrobust.evaluation.cell_evaluators import CellEvaluators
from mmrobust.evaluation.evaluator_cfg import (
    find_loading_step,
    is_coco_metric,
    side_file_metrics,
    type_name,
    use_fast_iou,
    without_backend,
)
from mmrobust.evaluation.robustness import RobustnessOptions
from mmrobust.evaluation.seg_metric import FastIoUMetric


@pytest.mark.parametrize('item', ['mmseg.IoUMetric', 'IoUMetric', IoUMetric,
                                  dict(type='mmseg.IoUMetric'), dict(type=IoUMetric)])
def test_a_type_name_is_the_same_scoped_unscoped_class_or_config(item):
    assert type_name(item) == 'IoUMetric'


def test_an_instance_is_named_by_its_class():
    assert type_name(FastIoUMetric()) == 'FastIoUMetric'


@pytest.mark.parametrize('metric', ['FastIoUMetric', 'mmseg.FastIoUMetric',
                                    'mmrobust.FastIoUMetric', 'mmseg.IoUMetric'])
def test_every_spelling_of_the_seg_metric_keeps_per_image_statistics(metric):
    # before one type_name, a scoped FastIoUMetric silently kept none: the per-image flag
    # compared the type string with 'FastIoUMetric' as written
    cfg = Config(dict(test_evaluator=dict(type=metric, iou_metrics=['mIoU'])))
    evaluators = CellEvaluators.build(cfg, RobustnessOptions(per_image=True))
    entry = evaluators(('fog', 1))[1][0]
    assert type_name(entry) == 'FastIoUMetric' and entry['per_image'] is True
    off = CellEvaluators.build(cfg, RobustnessOptions(per_image=False))
    assert 'per_image' not in off(('fog', 1))[1][0]


def test_scoped_coco_metrics_get_their_backend_and_lose_it_in_fingerprints():
    for name in ('CocoMetric', 'mmdet.CocoMetric', 'mmrobust.RobustCocoMetric',
                 'mmdet.RobustCocoMetric'):
        assert is_coco_metric(dict(type=name))
        assert without_backend(dict(type=name, backend='pycocotools'))['type'] in (
            'CocoMetric', 'mmdet.CocoMetric')
    assert not is_coco_metric(dict(type='mmdet.VOCMetric'))
    _, count = use_fast_iou([dict(type='mmseg.IoUMetric'), dict(type='mmdet.CocoMetric')])
    assert count == 1


def test_scoped_writers_and_loaders_are_found():
    assert 'CityscapesMetric' in side_file_metrics(dict(type='mmseg.CityscapesMetric'))
    assert find_loading_step([dict(type='mmdet.Resize'),
                              dict(type='mmcv.LoadImageFromFile')]) == 1
