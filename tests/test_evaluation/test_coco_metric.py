"""The COCO backends give pycocotools' numbers.

All 12 of bbox and of segm, to 1e-4, on a synthetic set with masks, crowd regions, empty images and
images without detections, with COCO's parameters and with mmdet's (maxDets 100/300/1000), and on
the toy set with the trained toy detector's predictions; RobustCocoMetric gives mmdet's CocoMetric's
keys with each backend.
"""
import copy
import json
import pickle

import numpy as np
import pytest
import torch

from mmrobust.datasets.synthetic_coco import (
    detections_to_coco_results,
    synthetic_coco_gt,
    synthetic_detections,
)
from mmrobust.evaluation.coco_metric import (
    COCO_BACKENDS,
    BackendNotInstalledError,
    RobustCocoMetric,
    UnknownBackendError,
    coco_backend,
)

from helpers import run_tool_here

FAST = ('faster-coco-eval', 'mmdet-mp')


def _stats(backend: str, gt_file: str, results: list, iou_type: str, mmdet_params: bool):
    lib = coco_backend(backend)
    gt = lib.coco(gt_file)
    evaluator = lib.cocoeval(gt, gt.loadRes(copy.deepcopy(results)), iou_type)
    if mmdet_params:  # what mmdet's CocoMetric sets
        evaluator.params.maxDets = [100, 300, 1000]
        evaluator.params.iouThrs = np.linspace(.5, 0.95, int(np.round((0.95 - .5) / .05)) + 1,
                                               endpoint=True)
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return np.asarray(evaluator.stats[:12], dtype=np.float64)


@pytest.fixture(scope='module')
def synthetic(tmp_path_factory):
    """150 images: masks, crowd regions in ~30 %, ~10 % without objects, ~5 % without detections.

    105 detections per image (over COCO's 100) over 20 classes.
    """
    gt = synthetic_coco_gt(150, num_classes=20, crowd_prob=0.3, empty_prob=0.1, seed=3)
    dets = synthetic_detections(gt, per_image=105, no_detection_prob=0.05, seed=3)
    path = tmp_path_factory.mktemp('coco') / 'gt.json'
    path.write_text(json.dumps(gt))
    assert any(a['iscrowd'] for a in gt['annotations'])
    with_anns = {a['image_id'] for a in gt['annotations']}
    assert len(with_anns) < len(gt['images'])
    assert any(len(d['scores']) == 0 for d in dets)
    areas = np.array([a['area'] for a in gt['annotations'] if not a['iscrowd']])
    assert (areas < 32**2).any() and (areas > 96**2).any()  # every area range is populated
    return str(path), gt, dets


@pytest.fixture(scope='module')
def reference(synthetic):
    """pycocotools' stats on the synthetic set, computed once per (iou_type, parameters)."""
    path, gt, dets = synthetic
    cache = {}

    def stats(iou_type: str, mmdet_params: bool) -> np.ndarray:
        if (iou_type, mmdet_params) not in cache:
            results = detections_to_coco_results(dets, gt, iou_type)
            cache[iou_type, mmdet_params] = _stats('pycocotools', path, results, iou_type,
                                                   mmdet_params)
        return cache[iou_type, mmdet_params]
    return stats


@pytest.mark.parametrize('mmdet_params', [False, True], ids=['coco-params', 'mmdet-params'])
@pytest.mark.parametrize('iou_type', ['bbox', 'segm'])
@pytest.mark.parametrize('backend', [
    'faster-coco-eval',
    # NOTE: not the default of any run, and 3-4x the time here: the end-to-end tier
    pytest.param('mmdet-mp', marks=pytest.mark.slow)])
def test_backends_equal_pycocotools_on_a_synthetic_set(synthetic, reference, backend, iou_type,
                                                       mmdet_params):
    path, gt, dets = synthetic
    results = detections_to_coco_results(dets, gt, iou_type)
    reference = reference(iou_type, mmdet_params)
    assert (reference > 0.05).sum() >= 10, reference  # a set on which the numbers mean something
    np.testing.assert_allclose(_stats(backend, path, results, iou_type, mmdet_params),
                               reference, rtol=0, atol=1e-4)


def _samples(dets):
    """``dets`` as mmdet's CocoMetric.process receives them."""
    return [{'img_id': d['img_id'], 'ori_shape': d['ori_shape'],
             'pred_instances': {'bboxes': torch.from_numpy(d['bboxes']),
                                'scores': torch.from_numpy(d['scores']),
                                'labels': torch.from_numpy(d['labels']),
                                'masks': d['masks']}} for d in dets]


def test_metric_gives_mmdets_keys_with_every_backend(synthetic):
    path, gt, dets = synthetic
    dets = dets[:50]  # NOTE: the numbers were compared above; here the keys and the plumbing
    meta = {'classes': tuple(c['name'] for c in gt['categories'])}
    out = {}
    for backend in COCO_BACKENDS:
        metric = RobustCocoMetric(backend=backend, ann_file=path, metric=['bbox', 'segm'])
        metric.dataset_meta = meta
        metric.process({}, _samples(dets))
        out[backend] = metric.evaluate(len(dets))
    from mmdet.evaluation import CocoMetric
    mmdet_metric = CocoMetric(ann_file=path, metric=['bbox', 'segm'])
    mmdet_metric.dataset_meta = meta
    mmdet_metric.process({}, _samples(dets))
    reference = mmdet_metric.evaluate(len(dets))
    assert len(reference) == 12 and reference['coco/segm_mAP'] > 0.03
    for backend, metrics in out.items():
        assert metrics.keys() == reference.keys()
        # NOTE: mmdet rounds to 3 decimals: numbers equal to 1e-4 may round 0.001 apart
        for key, value in metrics.items():
            assert abs(value - reference[key]) <= 1e-3 + 1e-9, (backend, key)


def test_metric_without_ann_file_parses_the_converted_ground_truth_with_its_backend(synthetic):
    path, gt, dets = synthetic
    from mmdet.datasets.api_wrappers import COCO
    coco = COCO(path)
    meta = {'classes': tuple(c['name'] for c in gt['categories'])}
    samples = _samples(dets[:40])
    for sample in samples:  # the ground truth as a dataset gives it to the metric
        img = coco.imgs[sample['img_id']]
        sample['width'], sample['height'] = img['width'], img['height']
        sample['instances'] = [
            {'bbox': [a['bbox'][0], a['bbox'][1], a['bbox'][0] + a['bbox'][2],
                      a['bbox'][1] + a['bbox'][3]], 'bbox_label': a['category_id'] - 1,
             'ignore_flag': a['iscrowd']}
            for a in coco.imgToAnns[sample['img_id']]]
    values = {}
    for backend in ('pycocotools', 'faster-coco-eval'):
        metric = RobustCocoMetric(backend=backend, metric='bbox')
        metric.dataset_meta = meta
        metric.process({}, copy.deepcopy(samples))
        values[backend] = metric.evaluate(len(samples))
        assert type(metric._coco_api).__module__.startswith(
            'faster_coco_eval' if backend == 'faster-coco-eval' else 'mmdet')
    assert values['pycocotools'] == pytest.approx(values['faster-coco-eval'], abs=1e-3)


def test_unknown_backend_lists_the_choices():
    with pytest.raises(UnknownBackendError, match="unknown COCO backend 'fast'.*pycocotools.*"
                       "faster-coco-eval.*mmdet-mp"):
        coco_backend('fast')
    with pytest.raises(TypeError, match="backend='mmdet-mp'"):
        RobustCocoMetric(backend='pycocotools', use_mp_eval=True)


def test_missing_backend_says_how_to_install_it(monkeypatch):
    import importlib
    real = importlib.import_module

    def no_faster(name, *args):
        if name == 'faster_coco_eval':
            raise ModuleNotFoundError("No module named 'faster_coco_eval'")
        return real(name, *args)

    monkeypatch.setattr(importlib, 'import_module', no_faster)
    with pytest.raises(BackendNotInstalledError,
                       match=r'pip install faster-coco-eval==\d+\.\d+\.\d+'):
        coco_backend('faster-coco-eval')


def test_backend_records_its_version():
    import faster_coco_eval
    label = coco_backend('faster-coco-eval').label
    assert label == f'faster-coco-eval {faster_coco_eval.__version__}'


@pytest.mark.slow
def test_backends_equal_pycocotools_on_the_trained_toy_detector(trained_toy_detector, toy_data,
                                                                tmp_path):
    preds = tmp_path / 'preds.pkl'
    run_tool_here('test.py', 'configs/toy/mask-rcnn_fan-t-hybrid_fpn_toy-coco.py',
                  trained_toy_detector / 'iter_300.pth', '--work-dir', tmp_path / 'test', '--out',
                  preds, '--cfg-options', 'test_dataloader.num_workers=0',
                  'test_dataloader.persistent_workers=False',
                  # COCO's 100 detections per image (the toy config keeps 20): the metric's cut
                  'model.test_cfg.rcnn.max_per_img=100')
    with open(preds, 'rb') as f:
        dumped = pickle.load(f)
    gt_file = str(toy_data['toy_coco'] / 'annotations' / 'instances_val2017.json')
    gt = json.loads(open(gt_file).read())
    dets = [{'img_id': d['img_id'], 'ori_shape': d['ori_shape'],
             'bboxes': np.asarray(d['pred_instances']['bboxes']),
             'scores': np.asarray(d['pred_instances']['scores']),
             'labels': np.asarray(d['pred_instances']['labels']),
             'masks': d['pred_instances']['masks']} for d in dumped]
    for iou_type in ('bbox', 'segm'):
        results = detections_to_coco_results(dets, gt, iou_type)
        reference = _stats('pycocotools', gt_file, results, iou_type, True)
        assert reference[0] > 0.05, reference  # the trained detector detects
        for backend in FAST:
            np.testing.assert_allclose(_stats(backend, gt_file, results, iou_type, True),
                                       reference, rtol=0, atol=1e-4, err_msg=backend)


def test_robustness_runs_choose_the_backend_of_every_coco_metric():
    from mmrobust.evaluation.evaluator_cfg import select_coco_backend, without_backend
    faster = coco_backend('faster-coco-eval').label
    evaluator = [dict(type='CocoMetric', ann_file='a.json', use_mp_eval=True),
                 dict(type='IoUMetric'), dict(type='CocoMetric', backend='pycocotools')]
    original = copy.deepcopy(evaluator)
    chosen, labels = select_coco_backend(copy.deepcopy(evaluator), None, 'faster-coco-eval')
    assert [e['type'] for e in chosen] == ['RobustCocoMetric', 'IoUMetric', 'RobustCocoMetric']
    assert [e.get('backend') for e in chosen] == ['faster-coco-eval', None, 'pycocotools']
    assert 'use_mp_eval' not in chosen[0]  # replaced by the chosen backend
    assert labels == [faster, coco_backend('pycocotools').label]
    # the user's choice wins over the metric's own; no default leaves mmdet's CocoMetric
    chosen, _ = select_coco_backend(copy.deepcopy(evaluator), 'mmdet-mp', 'faster-coco-eval')
    assert [e.get('backend') for e in chosen] == ['mmdet-mp', None, 'mmdet-mp']
    kept, labels = select_coco_backend(dict(metrics=[dict(type='CocoMetric')]), None, None)
    assert kept['metrics'][0]['type'] == 'CocoMetric' and labels == [
        coco_backend('pycocotools').label]
    # what is evaluated does not depend on the backend (results files resume across them)
    assert without_backend(select_coco_backend(copy.deepcopy(evaluator), 'mmdet-mp')[0]) == \
        without_backend(original)
    with pytest.raises(UnknownBackendError, match='choose one of'):
        select_coco_backend(copy.deepcopy(evaluator), 'nope')


def test_metric_benchmark_prints_ratios_and_checks_equality(tmp_path):
    proc = run_tool_here('analysis_tools/benchmark_coco_metric.py', '--n', '12', '--per-image',
                         '20', '--rounds', '1', '--backends', 'faster-coco-eval', '--device', 'cpu')
    out = proc.stdout
    assert '| backend | s per cell (1 rounds) | ms per image | pycocotools / backend |' in out
    rows = [line for line in out.splitlines() if line.startswith('| faster-coco-eval ')]
    assert len(rows) == 1 and rows[0].rstrip().endswith('|'), out
    assert float(rows[0].split('|')[5]) <= 1e-4  # the stats agree
    # the mask encoding inside the loop, mmdet's and ours (identical, or the tool stops)
    for case in ('mmrobust encode_masks', 'mmrobust device_runs (cpu)'):
        rows = [line for line in out.splitlines() if line.startswith(f'| {case} |')]
        assert len(rows) == 1 and rows[0].rstrip().endswith('x |'), out


def test_test_tool_honours_a_configured_backend(tmp_path):
    from mmengine.config import Config

    from mmrobust.apis import apply_test_args

    from helpers import REPO
    config = str(REPO / 'configs/toy/mask-rcnn_r18_fpn_toy-coco.py')
    ckpt = tmp_path / 'x.pth'
    ckpt.write_bytes(b'')
    cfg = Config.fromfile(config)
    cfg.merge_from_dict({'test_evaluator.backend': 'faster-coco-eval'})
    cfg = apply_test_args(cfg, str(ckpt))
    assert cfg.test_evaluator['type'] == 'RobustCocoMetric'
    plain = apply_test_args(Config.fromfile(config), str(ckpt))
    assert plain.test_evaluator['type'] == 'CocoMetric'  # the config's own metric otherwise


def _mask_cases(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Empty, full, noisy, sparse, box-shaped, full-height and cross-shaped masks."""
    masks = [np.zeros((h, w), bool), np.ones((h, w), bool)]
    for k in range(24):
        mask = np.zeros((h, w), bool)
        if k % 4 == 0:
            mask = rng.random((h, w)) < 0.5
        elif k % 4 == 1:
            mask = rng.random((h, w)) < 0.02
        elif k % 4 == 2:
            y, x = rng.integers(0, h), rng.integers(0, w)
            mask[y:y + rng.integers(1, h + 1), x:x + rng.integers(1, w + 1)] = True
        else:
            mask[:, rng.integers(0, w)] = True
            mask[rng.integers(0, h), :] = True
        masks.append(mask)
    return np.stack(masks)


@pytest.mark.parametrize('size', [(1, 1), (1, 5), (5, 1), (7, 3), (33, 17), (480, 640)])
def test_masks_are_run_length_encoded_as_pycocotools_does(size):
    from mmdet.structures.mask import encode_mask_results

    from mmrobust.evaluation.mask_rle import encode_masks
    masks = _mask_cases(np.random.default_rng(size[0] * 1000 + size[1]), *size)
    for given in (masks, masks.astype(np.uint8), torch.from_numpy(masks)):
        assert encode_masks(given) == encode_mask_results(masks)  # byte for byte
    assert encode_masks(np.zeros((0, *size), bool)) == []


@pytest.mark.parametrize('size', [(1, 1), (1, 5), (5, 1), (7, 3), (33, 17), (480, 640)])
@pytest.mark.parametrize('chunk', [1, 1 << 28])
def test_masks_on_a_device_are_encoded_there_as_pycocotools_does(size, chunk, monkeypatch):
    """The device RLE path gives pycocotools' bytes.

    The device path (change points found by tensor ops, only they copied to the host) over empty,
    full, noisy and wrap-around masks (a run from one column's bottom into the next's top), in one
    chunk and mask by mask; on CUDA too where there is one.
    """
    from mmdet.structures.mask import encode_mask_results

    from mmrobust.evaluation import mask_rle
    monkeypatch.setattr(mask_rle, 'DEVICE_CHUNK', chunk)
    h, w = size
    masks = _mask_cases(np.random.default_rng(h * 1000 + w), h, w)
    wrap = np.zeros((1, h, w), bool)
    wrap[0, h // 2:, 0] = wrap[0, :h // 2 + 1, min(1, w - 1)] = True
    masks = np.concatenate([masks, wrap])
    expected = encode_mask_results(masks)
    devices = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])
    for device in devices:
        for given in (torch.from_numpy(masks), torch.from_numpy(masks.astype(np.uint8))):
            runs = mask_rle.device_runs(given.to(device))
            got = [{'size': [h, w], 'counts': s} for s in mask_rle.rle_strings(runs)]
            assert got == expected  # byte for byte
            if device != 'cpu':
                assert mask_rle.encode_masks(given.to(device)) == expected
    assert mask_rle.device_runs(torch.zeros((0, h, w), dtype=torch.bool)) == []


def test_robust_metric_processes_masks_as_mmdet_does(synthetic):
    from mmdet.evaluation import CocoMetric
    path, gt, dets = synthetic
    rng = np.random.default_rng(0)
    samples = []
    for d in dets[:4]:
        h, w = d['ori_shape']
        masks = torch.from_numpy(_mask_cases(rng, h, w)[:len(d['scores'])])
        n = len(masks)
        samples.append({'img_id': d['img_id'], 'ori_shape': d['ori_shape'], 'pred_instances': {
            'bboxes': torch.from_numpy(d['bboxes'][:n]), 'scores': torch.from_numpy(
                d['scores'][:n]), 'labels': torch.from_numpy(d['labels'][:n]), 'masks': masks}})
    ours, theirs = RobustCocoMetric(ann_file=path), CocoMetric(ann_file=path)
    ours.process({}, samples)
    theirs.process({}, samples)
    assert len(ours.results) == len(theirs.results) == 4
    for (gt_a, a), (gt_b, b) in zip(ours.results, theirs.results):
        assert gt_a == gt_b and a['masks'] == b['masks']
        assert all(np.array_equal(a[k], b[k]) for k in ('bboxes', 'scores', 'labels'))
    assert isinstance(samples[0]['pred_instances']['masks'], torch.Tensor)  # left as it was


def _shuffled_categories(synthetic, tmp_path) -> str:
    """The synthetic ground truth with its categories listed out of id order (Objects365 v1)."""
    path, gt, _ = synthetic
    shuffled = copy.deepcopy(gt)
    shuffled['categories'] = shuffled['categories'][::-1]
    out = tmp_path / 'gt_unsorted.json'
    out.write_text(json.dumps(shuffled))
    return str(out)


@pytest.mark.parametrize('backend', sorted(COCO_BACKENDS))
def test_sort_categories_is_honoured_as_mmdet_does(synthetic, tmp_path, backend):
    from mmdet.evaluation import CocoMetric
    path, gt, dets = synthetic
    unsorted = _shuffled_categories(synthetic, tmp_path)
    meta = {'classes': tuple(c['name'] for c in gt['categories'])}
    values = []
    for metric in (CocoMetric(ann_file=unsorted, metric='bbox', sort_categories=True),
                   RobustCocoMetric(backend=backend, ann_file=unsorted, metric='bbox',
                                    sort_categories=True)):
        metric.dataset_meta = meta
        metric.process({}, _samples(dets[:40]))
        values.append(metric.evaluate(40))
    assert values[0]['coco/bbox_mAP'] > 0.03
    assert values[1] == pytest.approx(values[0], abs=1e-3)


@pytest.mark.parametrize('backend', sorted(COCO_BACKENDS))
def test_a_cell_without_any_detection_scores_zero(synthetic, backend):
    path, gt, dets = synthetic
    meta = {'classes': tuple(c['name'] for c in gt['categories'])}
    empty = []
    for d in dets[:20]:
        h, w = d['ori_shape']
        empty.append({**d, 'bboxes': np.zeros((0, 4), np.float32),
                      'scores': np.zeros(0, np.float32), 'labels': np.zeros(0, np.int64),
                      'masks': torch.zeros((0, h, w), dtype=torch.bool)})
    metric = RobustCocoMetric(backend=backend, ann_file=path, metric=['bbox', 'segm'],
                              per_image=True)
    metric.dataset_meta = meta
    metric.process({}, _samples(empty))
    values = metric.compute_metrics(metric.results)
    for iou in ('bbox', 'segm'):
        for item in ('mAP', 'mAP_50', 'mAP_75'):
            assert values[f'{iou}_{item}'] == 0.0, (backend, iou, item)
    # the per-image matching of the empty cell is there too, so the bootstrap counts it
    from mmrobust.evaluation.per_image import PER_IMAGE_KEY
    assert [b['metric_prefix'] for b in values[PER_IMAGE_KEY]] == ['bbox_', 'segm_']


def test_the_backend_is_the_metrics_own_and_mmdets_module_is_left_alone(synthetic):
    """Each metric evaluates with its own backend; mmdet's module names are never swapped.

    Before, ``compute_metrics`` swapped ``COCOeval`` in mmdet's module (under a lock, with the
    evaluated objects in a module list): a metric of another backend in the same process saw
    the swapped class.
    """
    import dataclasses
    import threading

    from mmdet.evaluation.metrics import coco_metric as mmdet_module
    path, gt, dets = synthetic
    dets = dets[:30]
    meta = {'classes': tuple(c['name'] for c in gt['categories'])}
    original = mmdet_module.COCOeval
    seen = []

    def metric(backend):
        m = RobustCocoMetric(backend=backend, ann_file=path, metric=['bbox'], per_image=True)
        cocoeval = m.backend.cocoeval

        class Watched(cocoeval):
            def evaluate(self):
                seen.append(mmdet_module.COCOeval)
                super().evaluate()

        m.backend = dataclasses.replace(m.backend, cocoeval=Watched)
        m.dataset_meta = meta
        m.process({}, _samples(dets))
        return m

    def computed(m):
        return m.compute_metrics(m.results)
    serial = {b: computed(metric(b)) for b in ('pycocotools', 'faster-coco-eval')}
    assert seen and all(cls is original for cls in seen)
    together = {}
    metrics = {b: metric(b) for b in serial}
    threads = [threading.Thread(target=lambda b=b: together.__setitem__(b, computed(metrics[b])))
               for b in metrics]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    from mmrobust.evaluation.per_image import PER_IMAGE_KEY
    for b in serial:
        assert {k: v for k, v in together[b].items() if k != PER_IMAGE_KEY} == {
            k: v for k, v in serial[b].items() if k != PER_IMAGE_KEY}
        assert len(together[b][PER_IMAGE_KEY]) == 1  # NOTE: its own evaluation, not the other's
    assert mmdet_module.COCOeval is original


#: mmdet's CocoMetric options a config may set, each checked on every backend
MMDET_OPTIONS = {
    'bbox-segm': dict(metric=['bbox', 'segm']),
    'classwise': dict(metric='bbox', classwise=True),
    'proposal': dict(metric='proposal', proposal_nums=(10, 30, 100)),
    'iou-thrs': dict(metric='bbox', iou_thrs=[0.5, 0.75]),
    'metric-items': dict(metric=['bbox', 'segm'], metric_items=['mAP_50', 'mAP_s', 'AR@100']),
}


@pytest.mark.parametrize('options', list(MMDET_OPTIONS.values()), ids=list(MMDET_OPTIONS))
@pytest.mark.parametrize('backend', sorted(COCO_BACKENDS))
def test_every_option_of_mmdets_metric_gives_mmdets_keys_and_numbers(synthetic, backend,
                                                                     options):
    """RobustCocoMetric runs mmdet's own computation: as mmdet changes it, this says so."""
    from mmdet.evaluation import CocoMetric
    path, gt, dets = synthetic
    dets = dets[:30]
    meta = {'classes': tuple(c['name'] for c in gt['categories'])}
    out = []
    for metric in (CocoMetric(ann_file=path, **options),
                   RobustCocoMetric(backend=backend, ann_file=path, **options)):
        metric.dataset_meta = meta
        metric.process({}, _samples(dets))
        out.append(metric.evaluate(len(dets)))
    reference, robust = out
    assert robust.keys() == reference.keys() and reference
    for key, value in robust.items():
        if isinstance(value, float):  # NOTE: mmdet rounds to 3 decimals
            assert abs(value - reference[key]) <= 1e-3 + 1e-9, key
        else:
            assert value == reference[key], key
