"""What a reviewer asks of robustness numbers (evaluation/comparisons.py).

Effective robustness recovered on a synthetic family of models, per-corruption differences with
Holm's correction (their calibration, with seeds, is in test_significance.py), and pycocotools' -1
kept out of intervals.
"""
import json

import numpy as np
import pytest

from mmrobust.evaluation.comparisons import effective_robustness, per_corruption_differences
from mmrobust.evaluation.uncertainty import interval


def _logit(v):
    return np.log(v / (1 - v))


def _sigmoid(v):
    return 1 / (1 + np.exp(-v))


@pytest.mark.parametrize('axis', ['logit', 'linear'])
def test_effective_robustness_recovers_a_model_above_the_baselines_line(axis):
    """Baselines exactly on a known trend (mIoU in %), a model 5 points above it.

    Its ER is 5 within its interval, the baselines' about 0; the line is the one they were made on.
    """
    rng = np.random.default_rng(0)
    a, b = 1.3, -0.9
    clean = np.array([35., 45., 55., 65., 75.])

    def trend(x):
        return (100 * _sigmoid(a * _logit(x / 100) + b) if axis == 'logit'
                else 0.8 * x - 10)
    points = {f'base{i}': (float(x), float(trend(x))) for i, x in enumerate(clean)}
    points['robust'] = (60.0, float(trend(60.0)) + 5.0)
    reps = {k: (p + rng.normal(0, 0.4, 1000), m + rng.normal(0, 0.4, 1000))
            for k, (p, m) in points.items()}
    out = effective_robustness(points, [f'base{i}' for i in range(5)], 100.0, axis, reps)
    if axis == 'logit':
        assert (out['slope'], out['intercept']) == pytest.approx((a, b), abs=1e-6)
    robust = out['models']['robust']
    assert robust['ER'] == pytest.approx(5.0, abs=1e-6)
    assert robust['low'] < 5.0 < robust['high'] and robust['high'] - robust['low'] < 4
    assert robust['low'] > 0  # clearly above the trend
    for i in range(5):
        assert out['models'][f'base{i}']['ER'] == pytest.approx(0.0, abs=1e-6)


def test_effective_robustness_needs_two_baselines():
    from mmrobust.utils.errors import UsageError
    with pytest.raises(UsageError, match='at least 2 baseline models'):
        effective_robustness({'a': (0.5, 0.3)}, ['a'], 1.0)
    with pytest.raises(UsageError, match='axis must be one of'):
        effective_robustness({'a': (0.5, 0.3), 'b': (0.6, 0.4)}, ['a', 'b'], 1.0, 'log')


def test_per_corruption_differences_find_the_corruptions_that_differ():
    """Two models on 5 corruptions x 3 severities, shared image draws.

    The second is 0.05 better on two corruptions and equal on three; Holm's correction flags exactly
    the two, and every interval holds the true difference.
    """
    rng = np.random.default_rng(1)
    true = {'gaussian_noise': 0.05, 'fog': 0.05, 'snow': 0.0, 'contrast': 0.0, 'blur': 0.0}
    base, other, base_pt, other_pt = {}, {}, {}, {}
    for c, delta in true.items():
        for s in (1, 2, 3):
            shared = 0.4 + rng.normal(0, 0.02, 1000)  # the image draw moves both models
            base[(c, s)] = shared + rng.normal(0, 0.005, 1000)
            other[(c, s)] = shared + delta + rng.normal(0, 0.005, 1000)
        base_pt[c] = 0.4
        other_pt[c] = 0.4 + delta
    rows = per_corruption_differences([base], [other], [base_pt], [other_pt], 0.95)
    assert list(rows) == list(true)
    assert [c for c, r in rows.items() if r['significant']] == ['gaussian_noise', 'fog']
    for c, r in rows.items():
        assert r['low'] <= true[c] <= r['high'] and r['p_holm'] >= r['p']
        assert r['difference'] == pytest.approx(true[c])


def test_a_replicate_without_ground_truth_in_an_area_range_is_left_out(tmp_path):
    """pycocotools' -1 (no large object in the resampled images) becomes NaN.

    The interval is that of the replicates that have a value, not pulled towards -1.
    """
    from test_uncertainty import _evaluated

    from mmrobust.datasets.synthetic_coco import (
        detections_to_coco_results,
        synthetic_coco_gt,
        synthetic_detections,
    )
    from mmrobust.evaluation.per_image import CocoAP, coco_block
    from mmrobust.evaluation.uncertainty import CellStats
    gt = synthetic_coco_gt(30, num_classes=4, seed=5)
    dets = synthetic_detections(gt, per_image=20, seed=5)
    path = tmp_path / 'gt.json'
    path.write_text(json.dumps(gt))
    ev = _evaluated('pycocotools', str(path), detections_to_coco_results(dets, gt, 'bbox'),
                    'bbox', True)
    ap = CocoAP(coco_block(ev, 'x_'))
    large = {a['image_id'] for a in gt['annotations'] if a['area'] > 96 ** 2}
    ids = sorted(im['id'] for im in gt['images'])
    assert large and len(large) < len(ids)
    no_large = np.array([[0.0 if i in large else 1.0 for i in ids]])
    assert ap.values(no_large)['x_mAP_l'][0] == -1.0  # pycocotools' sentinel
    stats = CellStats(images=list(ap.images), cells={('clean', 0): [(ap, np.arange(len(ids)))]})
    weights = np.concatenate([np.ones((1, len(ids))), no_large])
    scores = stats.scores(('clean', 0), weights)['x_mAP_l']
    assert scores[0] == scores[0] and np.isnan(scores[1])
    assert interval(scores, 0.95) == (pytest.approx(scores[0]), pytest.approx(scores[0]))
