"""Uncertainty of robustness numbers.

The per-image statistics recompute the metrics exactly (pycocotools' AP with every backend, mmseg's
IoU metrics), a bootstrap replicate equals the metric of the resampled set, 95 % intervals cover the
true value about 95 % of the time on synthetic data with a known answer, and the report gives
intervals, paired differences (refused for different image sets), seeds and CE / mCE.
"""
import contextlib
import copy
import csv
import io
import json
import re
import runpy
import sys

import numpy as np
import pytest
import torch

from mmrobust.datasets.synthetic_coco import (
    detections_to_coco_results,
    synthetic_coco_gt,
    synthetic_detections,
)
from mmrobust.evaluation.coco_metric import RobustCocoMetric, coco_backend
from mmrobust.evaluation.per_image import (
    PER_IMAGE_KEY,
    CocoAP,
    IoUStats,
    _eval_imgs_arrays,
    coco_block,
    iou_block,
    load_cell_stats,
    save_cell_stats,
    stats_dir,
    stats_path,
)
from mmrobust.evaluation.results import evaluation_sha256
from mmrobust.evaluation.shards import merge_results
from mmrobust.evaluation.uncertainty import (
    Bootstrap,
    PairingError,
    bootstrap_weights,
    cell_stats,
    check_pairable,
    corruption_errors,
    interval,
    replicate_summary,
    replicates_of,
    seed_statistics,
)

from helpers import REPO

ITEMS = ('mAP', 'mAP_50', 'mAP_75', 'mAP_s', 'mAP_m', 'mAP_l')


@pytest.fixture(scope='module')
def coco_set(tmp_path_factory):
    """60 images, 8 classes: crowd regions, empty images, images without detections."""
    gt = synthetic_coco_gt(60, num_classes=8, crowd_prob=0.3, empty_prob=0.1, seed=3)
    dets = synthetic_detections(gt, per_image=105, no_detection_prob=0.05, seed=3)
    path = tmp_path_factory.mktemp('coco') / 'gt.json'
    path.write_text(json.dumps(gt))
    return str(path), gt, dets


def _evaluated(backend: str, gt, results: list, iou_type: str, mmdet_params: bool, tmp=None):
    lib = coco_backend(backend)
    with contextlib.redirect_stdout(io.StringIO()):
        if not isinstance(gt, str):
            tmp.write_text(json.dumps(gt))
            gt = str(tmp)
        coco = lib.coco(gt)
        ev = lib.cocoeval(coco, coco.loadRes(copy.deepcopy(results)), iou_type)
        if mmdet_params:  # what mmdet's CocoMetric sets
            ev.params.maxDets = [100, 300, 1000]
            ev.params.iouThrs = np.linspace(.5, 0.95, 10, endpoint=True)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev


def _items(values: dict, row: int = 0) -> np.ndarray:
    return np.array([values[f'x_{k}'][row] for k in ITEMS])


@pytest.mark.parametrize('mmdet_params', [False, True], ids=['coco-params', 'mmdet-params'])
@pytest.mark.parametrize('iou_type', ['bbox', 'segm'])
def test_per_image_ap_with_unit_weights_is_pycocotools(coco_set, iou_type, mmdet_params):
    """pycocotools keeps its evalImgs; faster-coco-eval's are rebuilt from its IoUs.

    Both give pycocotools' six AP numbers back, to rounding.
    """
    path, gt, dets = coco_set
    results = detections_to_coco_results(dets, gt, iou_type)
    reference = _evaluated('pycocotools', path, results, iou_type, mmdet_params)
    assert (reference.stats[:6] > 0.05).sum() >= 5, reference.stats  # numbers that mean something
    for backend in ('pycocotools', 'faster-coco-eval'):
        ev = reference if backend == 'pycocotools' else _evaluated(backend, path, results,
                                                                   iou_type, mmdet_params)
        ap = CocoAP(coco_block(ev, 'x_'))
        assert len(ap.images) == len(gt['images'])
        np.testing.assert_allclose(_items(ap.values(np.ones((1, len(ap.images))))),
                                   reference.stats[:6], rtol=0, atol=1e-12, err_msg=backend)
    # a COCOeval without its IoUs (mmdet's COCOevalMP) is read from its evalImgs: the same
    from_eval_imgs = CocoAP({**coco_block(reference, 'x_'), **_eval_imgs_arrays(reference)})
    np.testing.assert_allclose(_items(from_eval_imgs.values(np.ones((1, len(ap.images))))),
                               reference.stats[:6], rtol=0, atol=1e-12)


def test_per_image_ap_keeps_the_top_100_of_a_class_for_map_under_mmdets_max_dets(tmp_path):
    """mmdet's maxDets (100, 300, 1000).

    mAP counts an image's 100 best detections of a class, mAP_50 and the others 1000; with 150 of
    one class per image the two differ.
    """
    gt = synthetic_coco_gt(16, num_classes=1, crowd_prob=0.2, empty_prob=0.1, seed=4)
    dets = synthetic_detections(gt, per_image=150, no_detection_prob=0.0, seed=4)
    results = detections_to_coco_results(dets, gt, 'bbox')
    path = tmp_path / 'gt.json'
    path.write_text(json.dumps(gt))
    reference = _evaluated('pycocotools', str(path), results, 'bbox', True)
    assert max(len(e['dtScores']) for e in reference.evalImgs if e) > 100
    for backend in ('pycocotools', 'faster-coco-eval'):
        ev = _evaluated(backend, str(path), results, 'bbox', True)
        ap = CocoAP(coco_block(ev, 'x_'))
        np.testing.assert_allclose(_items(ap.values(np.ones((1, len(ap.images))))),
                                   reference.stats[:6], rtol=0, atol=1e-12, err_msg=backend)


@pytest.mark.parametrize('iou_type', ['bbox', 'segm'])
def test_a_replicate_is_pycocotools_on_the_resampled_set(coco_set, iou_type, tmp_path):
    """Weights = draw counts give pycocotools' AP of the set with each drawn image repeated.

    Renumbered copies. Nothing is matched again, and nothing differs.
    """
    path, gt, dets = coco_set
    results = detections_to_coco_results(dets, gt, iou_type)
    ap = CocoAP(coco_block(_evaluated('pycocotools', path, results, iou_type, True), 'x_'))
    rng = np.random.default_rng(1)
    ids = sorted(im['id'] for im in gt['images'])
    images = {im['id']: im for im in gt['images']}
    drawn = rng.integers(0, len(ids), len(ids))
    resampled = {'images': [], 'annotations': [], 'categories': gt['categories']}
    res = []
    for new, i in enumerate(drawn, start=1):
        old = ids[i]
        resampled['images'].append({**images[old], 'id': new})
        resampled['annotations'] += [{**a, 'image_id': new,
                                      'id': len(resampled['annotations']) + k + 1}
                                     for k, a in enumerate(a for a in gt['annotations']
                                                           if a['image_id'] == old)]
        res += [{**r, 'image_id': new} for r in results if r['image_id'] == old]
    expected = _evaluated('pycocotools', resampled, res, iou_type, True, tmp_path / 'gt.json')
    weights = np.bincount(drawn, minlength=len(ids)).astype(float)[None]
    np.testing.assert_allclose(_items(ap.values(weights)), expected.stats[:6], rtol=0,
                               atol=1e-12)
    assert not np.allclose(_items(ap.values(weights)), _items(ap.values(np.ones_like(weights))))


def test_coco_metric_returns_per_image_blocks_only_when_asked(coco_set):
    path, gt, dets = coco_set
    samples = [{'img_id': d['img_id'], 'ori_shape': d['ori_shape'],
                'pred_instances': {'bboxes': torch.from_numpy(d['bboxes']),
                                   'scores': torch.from_numpy(d['scores']),
                                   'labels': torch.from_numpy(d['labels']),
                                   'masks': d['masks']}} for d in dets]
    out = {}
    for per_image in (False, True):
        metric = RobustCocoMetric(backend='faster-coco-eval', ann_file=path,
                                  metric=['bbox', 'segm'], per_image=per_image)
        metric.dataset_meta = {'classes': [c['name'] for c in gt['categories']]}
        metric.process({}, copy.deepcopy(samples))
        with contextlib.redirect_stdout(io.StringIO()):
            out[per_image] = metric.compute_metrics(metric.results)
    assert PER_IMAGE_KEY not in out[False]
    blocks = out[True].pop(PER_IMAGE_KEY)
    assert out[True] == out[False]  # the numbers are untouched
    assert [b['metric_prefix'] for b in blocks] == ['bbox_', 'segm_']
    for block in blocks:
        values = CocoAP(block).values(np.ones((1, len(gt['images']))))
        for name, value in values.items():  # mmdet rounds to 3 decimals
            assert abs(value[0] - out[True][name]) <= 5e-4, name


def _areas(rng, images: int, classes: int, p: np.ndarray, q: np.ndarray, scale: np.ndarray,
           difficulty=None):
    """Per-image (intersection, union, prediction, label) areas.

    Labels ~ Poisson(scale * 400) per class, recall p (binomial; times the image's ``difficulty``
    factor if given), false positives at rate q: IoU_c = p_c / (1 + q_c) without difficulty.
    """
    label = rng.poisson(scale[:, None] * 400, (images, classes)).astype(float)
    if difficulty is not None:
        p = np.clip(p[None, :] * difficulty[:, None], 0, 1)
    inter = rng.binomial(label.astype(int), p).astype(float)
    fp = rng.poisson(label * q).astype(float)
    pred = inter + fp
    return [(inter[i], pred[i] + label[i] - inter[i], pred[i], label[i]) for i in range(images)]


def test_iou_stats_are_mmsegs_numbers_and_weights_repeat_images():
    from mmseg.evaluation import IoUMetric
    rng = np.random.default_rng(0)
    areas = _areas(rng, 12, 5, rng.uniform(.3, .9, 5), rng.uniform(.1, .5, 5),
                   rng.gamma(2, .5, 12))
    areas[3] = tuple(np.where(np.arange(5) == 2, 0.0, a) for a in areas[3])  # absent class
    metric = IoUMetric(iou_metrics=['mIoU', 'mDice', 'mFscore'])
    metric.dataset_meta = {'classes': [str(c) for c in range(5)]}
    torch_areas = [tuple(torch.tensor(a) for a in item) for item in areas]
    expected = metric.compute_metrics(torch_areas)
    stats = IoUStats(iou_block(areas, [f'img{i}' for i in range(12)], ''))
    got = stats.values(np.ones((1, 12)))
    for name, value in expected.items():  # mmseg rounds to 2 decimals (in %)
        assert abs(got[name][0] - value) <= 0.005 + 1e-9, name
    draw = np.array([0, 0, 3, 5, 5, 5, 7, 8, 9, 11, 11, 2])
    repeated = metric.compute_metrics([torch_areas[i] for i in draw])
    weights = np.bincount(draw, minlength=12).astype(float)[None]
    for name, value in repeated.items():
        assert abs(stats.values(weights)[name][0] - value) <= 0.005 + 1e-9, name


# -- coverage --------------------------------------------------------------------------------------

DRAWS, IMAGES, CLASSES, REPLICATES = 500, 150, 4, 200
# The tolerance: the percentile bootstrap of these ratios on 150 images covers 0.935-0.94 (1000
# draws, measured); 500 draws estimate that with a standard error of 0.011, and [0.90, 0.99]
# leaves about 3.5 standard errors either side of 0.945.
COVERAGE = (0.90, 0.99)


def _synthetic_model(rng, scale, p, q, severities, difficulty=None):
    """One model's per-image statistics.

    The clean cell and cells whose recall falls with the severity; the same images (scale,
    difficulty) in every cell.
    """
    cells = {('clean', 0): _areas(rng, IMAGES, CLASSES, p, q, scale, difficulty)}
    for s in severities:
        cells[('gaussian_noise', s)] = _areas(rng, IMAGES, CLASSES, p * (1 - 0.15 * s), q,
                                              scale, difficulty)
    return cells


def _truth(p, q, severities):
    """mIoU (in %) of the population: IoU_c = E[I] / E[U] = p_c / (1 + q_c)."""
    def miou(pp):
        return 100 * float(np.mean(pp / (1 + q)))
    clean = miou(p)
    mpc = float(np.mean([miou(p * (1 - 0.15 * s)) for s in severities]))
    return clean, mpc, mpc / clean


def _as_stats(cells):
    from mmrobust.evaluation.uncertainty import CellStats
    names = [f'img{i}' for i in range(IMAGES)]
    stats = CellStats(images=names)
    for cell, areas in cells.items():
        stats.cells[cell] = [(IoUStats(iou_block(areas, names, '')), np.arange(IMAGES))]
    return stats


def test_intervals_cover_the_true_value_95_percent_of_the_time():
    """Over 500 synthetic test sets.

    150 images of heterogeneous size, 4 classes, the clean set and 3 severities. The 95 % intervals
    of P_clean, mPC, rPC and of the paired difference of mPC between two models cover the
    population's value in 90-99 % of the draws.
    """
    rng = np.random.default_rng(2024)
    severities = (1, 2, 3)
    p_a, q_a = np.array([.9, .7, .6, .8]), np.array([.2, .3, .1, .25])
    p_b, q_b = np.array([.85, .75, .65, .8]), np.array([.15, .3, .2, .2])
    truth_a, truth_b = _truth(p_a, q_a, severities), _truth(p_b, q_b, severities)
    protocol = [('gaussian_noise', s) for s in severities]
    hits = {k: 0 for k in ('P_clean', 'mPC', 'rPC', 'paired mPC')}
    for draw in range(DRAWS):
        scale = rng.gamma(2.0, 0.5, IMAGES)  # images differ in size: the bootstrap must see it
        a = _as_stats(_synthetic_model(rng, scale, p_a, q_a, severities))
        b = _as_stats(_synthetic_model(rng, scale, p_b, q_b, severities))
        weights = bootstrap_weights(IMAGES, REPLICATES, seed=draw)
        rep_a = replicate_summary(a, weights, protocol)['mIoU']
        rep_b = replicate_summary(b, weights, protocol)['mIoU']
        for k, q in enumerate(('P_clean', 'mPC', 'rPC')):
            lo, hi = interval(rep_a[q], 0.95)
            hits[q] += lo <= truth_a[k] <= hi
        lo, hi = interval(rep_b['mPC'] - rep_a['mPC'], 0.95)
        hits['paired mPC'] += lo <= truth_b[1] - truth_a[1] <= hi
    coverage = {k: v / DRAWS for k, v in hits.items()}
    assert all(COVERAGE[0] <= c <= COVERAGE[1] for c in coverage.values()), coverage


def test_paired_intervals_are_narrower_than_separate_ones():
    """The same images under both models (hard images are hard for both).

    The difference's interval is narrower than what two independent intervals would allow (why the
    report pairs).
    """
    rng = np.random.default_rng(5)
    scale, difficulty = rng.gamma(2.0, 0.5, IMAGES), rng.uniform(0.4, 1.1, IMAGES)
    p, q = np.array([.9, .7, .6, .8]), np.array([.2, .3, .1, .25])
    a = _as_stats(_synthetic_model(rng, scale, p, q, (1, 2), difficulty))
    b = _as_stats(_synthetic_model(rng, scale, p * 0.98, q, (1, 2), difficulty))
    weights = bootstrap_weights(IMAGES, 400, seed=0)
    protocol = [('gaussian_noise', 1), ('gaussian_noise', 2)]
    ra = replicate_summary(a, weights, protocol)['mIoU']['mPC']
    rb = replicate_summary(b, weights, protocol)['mIoU']['mPC']
    paired = np.subtract(*interval(rb - ra, 0.95)[::-1])
    separate = np.hypot(np.subtract(*interval(ra, .95)[::-1]),
                        np.subtract(*interval(rb, .95)[::-1]))
    assert paired < 0.5 * separate


# -- seeds, CE, pairing ----------------------------------------------------------------------------

def test_seed_statistics_are_mean_and_sample_std():
    summaries = [{'metrics': {'m': {'P_clean': c, 'mPC': m, 'rPC': m / c}}}
                 for c, m in ((0.40, 0.20), (0.42, 0.23), (0.41, 0.19))]
    stats = seed_statistics(summaries)['m']
    assert stats['P_clean'][0] == 3
    assert stats['mPC'][1] == pytest.approx(np.mean([.20, .23, .19]))
    assert stats['mPC'][2] == pytest.approx(np.std([.20, .23, .19], ddof=1))


def test_corruption_error_by_hand():
    """ImageNet-C's CE with E = 1 - AP (and 100 - mIoU for mmseg's percentages)."""
    model = {'clean': {0: {'ap': .40, 'mIoU': 70.0}},
             'fog': {1: {'ap': .30, 'mIoU': 60.0}, 2: {'ap': .20, 'mIoU': 50.0}},
             'snow': {1: {'ap': .35, 'mIoU': 65.0}}}
    ref = {'clean': {0: {'ap': .38, 'mIoU': 68.0}},
           'fog': {1: {'ap': .25, 'mIoU': 55.0}, 2: {'ap': .10, 'mIoU': 40.0}},
           'snow': {1: {'ap': .30, 'mIoU': 60.0}}}
    ce = corruption_errors(model, ref, 'ap')
    assert ce['per_corruption']['fog']['CE'] == pytest.approx((.7 + .8) / (.75 + .9))
    assert ce['per_corruption']['snow']['CE'] == pytest.approx(.65 / .70)
    assert ce['mCE'] == pytest.approx(((.7 + .8) / (.75 + .9) + .65 / .70) / 2)
    assert ce['per_corruption']['fog']['relative_CE'] == pytest.approx(
        (.1 + .2) / (.13 + .28))
    assert corruption_errors(model, ref, 'mIoU')['per_corruption']['fog']['CE'] == \
        pytest.approx((40 + 50) / (45 + 60))
    del ref['snow']
    with pytest.raises(ValueError, match='reference has no ap for: snow 1'):
        corruption_errors(model, ref, 'ap')


def _write_run(folder, name, cells, images, seed=0, skip=(), planned=None):
    """A results file and its per-image side files, as test_robustness.py writes them."""
    identity = {'format': 'mmrobust-robustness/1', 'protocol': 'custom',
                'cells_planned': planned or {'gaussian_noise': [1, 2]}, 'seed': seed,
                'bgr_compat': False, 'source': 'on-the-fly', 'config_sha256': 'cfg',
                'checkpoint_sha256': name.split('_shard')[0],
                'shard': None}
    path = folder / f'{name}.json'
    recorded = {}
    for (c, s), areas in cells.items():
        block = iou_block(areas, images, '')
        values = IoUStats(block).values(np.ones((1, len(images))))
        recorded.setdefault(c, {})[str(s)] = {k: round(float(v[0]), 2) for k, v in
                                              values.items() if k in ('mIoU', 'aAcc', 'mAcc')}
        if (c, s) not in skip:
            (folder / f'{name}_per_image').mkdir(exist_ok=True)
            save_cell_stats(stats_path(stats_dir(str(path)), c, s), (c, s),
                            evaluation_sha256(identity), [block])
    path.write_text(json.dumps({**identity, 'cells': recorded, 'timing': {}}))
    return path


def _report(*argv):
    """tools/robustness_report.py in this process: (exit code, stdout)."""
    out = io.StringIO()
    saved = sys.argv
    sys.argv = ['robustness_report.py', *map(str, argv)]
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
            runpy.run_path(str(REPO / 'tools' / 'robustness_report.py'), run_name='__main__')
    finally:
        sys.argv = saved
    return stop.value.code, out.getvalue()


def test_report_gives_intervals_paired_differences_seeds_and_ce(tmp_path):
    rng = np.random.default_rng(0)
    images = [f'leftImg8bit/val/c/img{i}.png' for i in range(40)]
    scale = rng.gamma(2.0, 0.5, 40)
    p, q = np.array([.9, .7, .6, .8]), np.array([.2, .3, .1, .25])

    def cells(recall):
        return {(c, s): _areas(rng, 40, 4, recall * (1 - .2 * s), q, scale)
                for c, s in (('clean', 0), ('gaussian_noise', 1), ('gaussian_noise', 2))}
    runs = [_write_run(tmp_path, f'{name}{k}', cells(p * f), images)
            for name, f in (('plain', 0.9), ('dat', 1.0)) for k in range(2)]
    code, out = _report(*runs, '--labels', 'plain', 'plain', 'DAT', 'DAT', '--reference',
                        runs[0], '--out-dir', tmp_path / 'rep', '--bootstrap', 100)
    assert code == 0
    assert '| plain #1 | mIoU |' in out and 'bootstrap percentile intervals' in out
    summary = list(csv.DictReader(open(tmp_path / 'rep' / 'summary.csv')))
    row = next(r for r in summary if r['model'] == 'DAT #2' and r['metric'] == 'mIoU')
    for quantity in ('P_clean', 'mPC', 'rPC'):
        lo, value, hi = (float(row[k]) for k in (f'{quantity}_low', quantity,
                                                 f'{quantity}_high'))
        assert lo < value < hi, quantity
    cells_rows = list(csv.DictReader(open(tmp_path / 'rep' / 'cells.csv')))
    assert all(r['ci_low'] and r['ci_high'] for r in cells_rows)
    paired = list(csv.DictReader(open(tmp_path / 'rep' / 'paired.csv')))
    mpc = next(r for r in paired if r['metric'] == 'mIoU' and r['quantity'] == 'mPC')
    assert (mpc['model'], mpc['minus']) == ('DAT', 'plain')
    assert 0 < float(mpc['ci_low']) <= float(mpc['difference']) <= float(mpc['ci_high'])
    seeds = list(csv.DictReader(open(tmp_path / 'rep' / 'seeds.csv')))
    assert {(r['recipe'], r['quantity']) for r in seeds} >= {('DAT', 'mPC'), ('plain', 'rPC')}
    assert all(r['files'] == '2' for r in seeds)
    ce = list(csv.DictReader(open(tmp_path / 'rep' / 'corruption_error.csv')))
    plain1 = next(r for r in ce if r['model'] == 'plain #1'
                  and r['corruption'].startswith('mean (mCE over '))
    assert float(plain1['CE']) == pytest.approx(1.0)  # the reference against itself
    assert (tmp_path / 'rep' / 'intervals_mIoU.png').stat().st_size > 0
    assert 'Corruption Error against plain0' in out
    # mCE with its interval over this run's images (the reference held fixed), the set named
    table = out[out.index('Corruption Error against plain0'):]
    row = next(line for line in table.splitlines() if line.startswith('| DAT #2 | mIoU |'))
    mce, lo, hi = (float(x) for x in re.match(r'\| DAT #2 \| mIoU \| ([\d.]+) \[([\d.]+), '
                                              r'([\d.]+)\]', row).groups())
    assert lo < mce < hi and row.endswith('| 1 of the 15 benchmark corruptions |')
    assert "mCE intervals: 95% over this run's test images (100 replicates)" in table
    # with the seeds in the paired interval and the per-corruption tests
    code, out = _report(*runs, '--labels', 'plain', 'plain', 'DAT', 'DAT', '--seed-bootstrap',
                        '--out-dir', tmp_path / 'rep2', '--bootstrap', 100)
    assert code == 0, out
    assert 'varies: seeds and images):' in out
    assert ('varies: seeds and images: the between-seed variance (2 df, at its 99% upper '
            'bound) and the bootstrap over the images') in out
    assert 'a statement about the recipes.' in out
    tests = list(csv.DictReader(open(tmp_path / 'rep2' / 'per_corruption_tests.csv')))
    assert [(r['corruption'], r['seed_df']) for r in tests] == [('gaussian_noise', '2')]
    paired = list(csv.DictReader(open(tmp_path / 'rep2' / 'paired.csv')))
    mpc = next(r for r in paired if r['metric'] == 'mIoU' and r['quantity'] == 'mPC')
    assert float(mpc['ci_low']) <= float(mpc['difference']) <= float(mpc['ci_high'])


def test_report_refuses_to_pair_different_images_and_says_what_is_missing(tmp_path):
    rng = np.random.default_rng(1)
    q = np.array([.2, .3])

    def cells(n):
        scale = rng.gamma(2.0, 0.5, n)
        return {(c, s): _areas(rng, n, 2, np.array([.8, .7]), q, scale)
                for c, s in (('clean', 0), ('gaussian_noise', 1), ('gaussian_noise', 2))}
    a = _write_run(tmp_path, 'a', cells(30), [f'i{k}' for k in range(30)])
    b = _write_run(tmp_path, 'b', cells(28), [f'i{k}' for k in range(28)])
    c = _write_run(tmp_path, 'c', cells(30), [f'i{k}' for k in range(30)], seed=1)
    d = _write_run(tmp_path, 'd', cells(30), [f'i{k}' for k in range(30)],
                   skip=[('gaussian_noise', 2)])
    code, out = _report(a, b, c, d, '--out-dir', tmp_path / 'rep', '--bootstrap', 50)
    assert code == 0
    assert 'paired difference b - a refused' in out and '2 only in a' in out
    assert "seed: a has 0, c 1" in out
    assert 'd: 1 cell(s) have no per-image statistics' in out
    assert 'd: no mPC / rPC interval' in out
    # d pairs with a on the clean set only (a cell of its protocol has no statistics)
    paired = list(csv.DictReader(open(tmp_path / 'rep' / 'paired.csv')))
    assert {(r['model'], r['quantity']) for r in paired if r['metric'] == 'mIoU'} == {
        ('d', 'P_clean')}
    with pytest.raises(PairingError, match='images: a has 30, b 28'):
        stats = {p.stem: cell_stats(str(p), json.loads(p.read_text())) for p in (a, b)}
        check_pairable(('a', json.loads(a.read_text()), stats['a']),
                       ('b', json.loads(b.read_text()), stats['b']))


def test_merged_shards_find_their_shards_per_image_files(tmp_path):
    rng = np.random.default_rng(2)
    images = [f'i{k}' for k in range(20)]
    scale = rng.gamma(2.0, 0.5, 20)
    cells = {(c, s): _areas(rng, 20, 2, np.array([.8, .7]), np.array([.2, .3]), scale)
             for c, s in (('clean', 0), ('gaussian_noise', 1), ('gaussian_noise', 2))}
    shards = []
    for index, part in enumerate(([('clean', 0), ('gaussian_noise', 2)], [('gaussian_noise', 1)])):
        path = _write_run(tmp_path, f'r_shard{index}of2', {c: cells[c] for c in part}, images)
        data = json.loads(path.read_text())
        data['shard'] = {'index': index, 'count': 2}
        path.write_text(json.dumps(data))
        shards.append((str(path), data))
    # NOTE: the shards' fingerprints leave the shard out, so the merge's matches them
    merged = merge_results(shards)
    merged_path = tmp_path / 'merged.json'
    merged_path.write_text(json.dumps(merged))
    loaded = json.loads(merged_path.read_text())
    loaded['cells'] = {c: {int(s): v for s, v in by.items()} for c, by in loaded['cells'].items()}
    stats, reps = replicates_of(str(merged_path), loaded, Bootstrap(50))
    assert not stats.missing and set(stats.cells) == set(cells)
    assert reps['mIoU']['mPC'].shape == (50, )
    stored = load_cell_stats(stats_path(stats_dir(shards[1][0]), 'gaussian_noise', 1))
    assert stored['meta']['cell'] == ['gaussian_noise', 1]


def test_model_zoo_check_gives_intervals_where_per_image_statistics_exist(tmp_path):
    from mmrobust.apis.model_zoo import check_results, load_zoo
    rng = np.random.default_rng(1)
    images = [f'leftImg8bit/val/c/img{i}.png' for i in range(40)]
    scale = rng.gamma(2.0, 0.5, 40)
    p, q = np.array([.9, .7, .6, .8]), np.array([.2, .3, .1, .25])
    cells = {(c, s): _areas(rng, 40, 4, p * (1 - .2 * s), q, scale)
             for c, s in (('clean', 0), ('gaussian_noise', 1), ('gaussian_noise', 2))}
    path = _write_run(tmp_path, 'run', cells, images)
    results = json.loads(path.read_text())
    results['config'] = 'configs/fan/segformer_fan-s-hybrid_8xb1-160k_cityscapes-1024x1024.py'
    _, lines = check_results(results, load_zoo(str(REPO)), str(path))
    clean = re.match(r'Cityscapes mIoU: P_clean ([\d.]+) \[([\d.]+), ([\d.]+); 95%, 1000 '
                     r'replicates\] vs published',
                     lines[0])
    assert clean, lines
    lo, value, hi = float(clean.group(2)), float(clean.group(1)), float(clean.group(3))
    assert lo < value < hi
    assert re.search(r'mPC [\d.]+ \[[\d.]+, [\d.]+; 95%, 1000 replicates\] vs published 66.4 '
                     r'\(published on '
                     'protocol fan_city_c', lines[1]), lines


def test_report_gives_effective_robustness_and_per_corruption_differences(tmp_path):
    """Three toy models on the same images.

    The effective-robustness table and plot against the two plain ones as baselines, and the
    per-corruption table of DAT minus plain with Holm's correction; every interval states its
    replicates.
    """
    rng = np.random.default_rng(3)
    images = [f'leftImg8bit/val/c/img{i}.png' for i in range(40)]
    scale = rng.gamma(2.0, 0.5, 40)
    q = np.array([.2, .3, .1, .25])

    def cells(recall, drop):
        return {(c, s): _areas(rng, 40, 4, recall * (1 - drop * s), q, scale)
                for c, s in (('clean', 0), ('gaussian_noise', 1), ('gaussian_noise', 2),
                             ('fog', 1), ('fog', 2))}
    planned = {'gaussian_noise': [1, 2], 'fog': [1, 2]}
    runs = [_write_run(tmp_path, name, cells(np.array([.9, .7, .6, .8]) * f, drop), images,
                       planned=planned)
            for name, f, drop in (('small', 0.7, .25), ('large', 1.0, .25),
                                  ('dat', 0.85, .1))]
    code, out = _report(*runs, '--labels', 'small', 'large', 'DAT', '--baselines', 'small',
                        'large', '--out-dir', tmp_path / 'rep', '--bootstrap', 200)
    assert code == 0, out
    table = out[out.index('Effective robustness, mIoU'):]
    assert 'in logit axes (95% interval, 200 replicates' in table
    dat = next(line for line in table.splitlines() if line.startswith('| DAT |'))
    er, lo, hi = (float(x) for x in re.search(r'\| (-?[\d.]+) \[(-?[\d.]+), (-?[\d.]+)\] \|$',
                                              dat).groups())
    assert lo <= er <= hi and er > 0  # DAT loses less under corruption than the trend
    assert '| small (baseline) |' in table
    assert (tmp_path / 'rep' / 'effective_robustness_mIoU.png').stat().st_size > 0
    per = out[out.index('small minus'):] if 'small minus' in out else out[
        out.index('large minus'):]
    assert 'varies: images (seeds averaged; seed variance not included)' in per
    assert 'Holm over the 2 corruptions' in per
    assert re.search(r'\| fog \| -?[\d.]+ \| \[-?[\d.]+, -?[\d.]+\] \| (< )?[\d.e-]+ ± '
                     r'[\d.e-]+ \| (< )?[\d.e-]+ \| (better|worse|not shown|undecided) \|', per)
    assert re.search(r'is better than .* on \d and worse on \d of 2 corruptions at a '
                     r'family-wise error rate of 0.05 \(Holm\), a statement about these '
                     'checkpoints on these test images, not their recipes', per)
    tests = list(csv.DictReader(open(tmp_path / 'rep' / 'per_corruption_tests.csv')))
    assert {r['corruption'] for r in tests} == {'gaussian_noise', 'fog'}
    assert {r['seed_df'] for r in tests} == {'0'} and all(float(r['p_mc_error']) >= 0
                                                          for r in tests)
