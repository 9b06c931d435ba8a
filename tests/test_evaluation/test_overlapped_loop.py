"""The robustness loop's host work beside the model (evaluation/loop/overlapped.py).

Batches post-processed in order on a thread, preprocessed ahead on another, errors raised in the
loop, and a run's numbers identical to the serial loop's; ground-truth masks that no metric reads
are not decoded.
"""
import threading
import time

import pytest
import torch
from mmdet.models.detectors.base import BaseDetector
from mmdet.registry import MODELS
from mmengine.config import Config
from mmengine.structures import InstanceData

from helpers import DEMO_DET_CFG, REPO


class _Recorder:
    """An evaluator stand-in: records what it processes, on which thread, slowly."""

    def __init__(self, fail_at=None, delay=0.0) -> None:
        self.seen, self.threads = [], set()
        self.fail_at, self.delay = fail_at, delay

    def process(self, data_samples, data_batch) -> None:
        time.sleep(self.delay * (1 + (data_batch % 3)))  # NOTE: uneven, to shake the order
        if data_batch == self.fail_at:
            raise ValueError(f'metric failed on batch {data_batch}')
        self.seen.append(data_batch)
        self.threads.add(threading.current_thread().name)


@pytest.mark.parametrize('depth', [0, 1, 3])
def test_post_processing_keeps_the_order_on_its_own_thread(depth):
    from mmrobust.evaluation.loop import PostProcessThread
    recorder = _Recorder(delay=0.002)
    post = PostProcessThread(recorder, depth)
    for batch in range(12):
        post.submit([], batch)
    post.drain()
    assert recorder.seen == list(range(12))
    expected = threading.current_thread().name if depth == 0 else 'mmrobust-post-process'
    assert recorder.threads == {expected}
    post.close()


def test_post_processing_error_is_raised_in_the_loop_and_stops_the_batches_after_it():
    from mmrobust.evaluation.loop import PostProcessThread
    recorder = _Recorder(fail_at=3)
    post = PostProcessThread(recorder, 2)
    with pytest.raises(ValueError, match='metric failed on batch 3'):
        for batch in range(8):
            post.submit([], batch)
        post.drain()
    assert recorder.seen == [0, 1, 2]  # nothing after the failed batch
    with pytest.raises(ValueError, match='batch 3'):  # nor later: the error stays
        post.submit([], 9)
    post.close(cancel=True)
    assert recorder.seen == [0, 1, 2]


def test_post_processing_queue_is_bounded():
    """A full queue makes the loop wait (counted in wait_s) instead of holding every batch."""
    from mmrobust.evaluation.loop import PostProcessThread
    gate = threading.Event()

    class Blocked:
        def process(self, data_samples, data_batch):
            gate.wait()

    post = PostProcessThread(Blocked(), 1)
    post.submit([], 0)  # taken by the thread, which blocks
    time.sleep(0.05)
    post.submit([], 1)  # waits in the queue
    timer = threading.Timer(0.2, gate.set)
    timer.start()
    start = time.perf_counter()
    post.submit([], 2)  # the queue is full until the gate opens
    assert time.perf_counter() - start >= 0.15 and post.wait_s >= 0.15
    post.drain()
    post.close()


def test_prefetch_keeps_the_order_raises_where_its_batch_was_due_and_stops_early():
    from mmrobust.evaluation.loop import BatchPrefetcher

    def preprocess(batch):
        if batch == 5:
            raise RuntimeError('cannot preprocess batch 5')
        return batch * 10

    prefetcher = BatchPrefetcher(range(8), preprocess, depth=2)
    got = []
    with pytest.raises(RuntimeError, match='batch 5'):
        for item in prefetcher:
            got.append(item)
    assert got == [(b, b * 10) for b in range(5)]
    assert not prefetcher._thread.is_alive()
    early = BatchPrefetcher(iter(range(10 ** 6)), lambda b: b, depth=2)
    assert next(early) == (0, 0)
    early.close()  # a loop stopped by an error: the thread ends without draining the source
    assert not early._thread.is_alive()


def test_prefetch_splits_only_the_plain_test_step():
    from mmrobust.evaluation.loop import split_test_step

    class OwnTestStep(OverlapStub):
        def test_step(self, data):
            return super().test_step(data)

    plain = OverlapStub()
    preprocess, predict = split_test_step(plain)
    batch = {'inputs': [torch.zeros(3, 8, 8, dtype=torch.uint8)],
             'data_samples': [_sample((8, 8))]}
    assert len(predict(preprocess(batch))) == 1
    assert split_test_step(OwnTestStep()) is None
    assert split_test_step(torch.nn.Linear(1, 1)) is None


# -- a deterministic detector of the image content, and the loop end to end ---------------------

def _sample(shape):
    from mmdet.structures import DetDataSample
    return DetDataSample(metainfo=dict(img_id=0, ori_shape=shape, img_shape=shape,
                                       scale_factor=(1.0, 1.0)))


@MODELS.register_module(force=True)
class OverlapStub(BaseDetector):
    """Predicts the ground-truth boxes, shifted and scored by the image's content (so cells differ).

    With box-shaped masks at the original size.
    """

    def __init__(self, data_preprocessor=None) -> None:
        super().__init__(data_preprocessor=data_preprocessor or dict(
            type='mmdet.DetDataPreprocessor', mean=[0, 0, 0], std=[255, 255, 255]))

    def predict(self, batch_inputs, batch_data_samples, rescale=True):
        for image, sample in zip(batch_inputs, batch_data_samples):
            h, w = sample.ori_shape
            level = float(image.mean())
            gt_instances = sample.gt_instances if 'gt_instances' in sample else InstanceData(
                bboxes=torch.zeros(0, 4), labels=torch.zeros(0, dtype=torch.long))
            gt = gt_instances.bboxes
            labels = torch.cat([gt_instances.labels, torch.zeros(2, dtype=torch.long)])
            scale = torch.tensor(sample.scale_factor).repeat(2)
            boxes = gt / scale + 4 * level
            extra = torch.tensor([[2.0, 2.0, w / 3, h / 3], [w / 2, h / 2, w - 1.0, h - 1.0]])
            boxes = torch.cat([boxes, extra]).clamp(min=0)
            boxes[:, 0::2] = boxes[:, 0::2].clamp(max=w - 1)
            boxes[:, 1::2] = boxes[:, 1::2].clamp(max=h - 1)
            n = len(boxes)
            masks = torch.zeros((n, h, w), dtype=torch.bool)
            for mask, (x1, y1, x2, y2) in zip(masks, boxes.round().long().tolist()):
                mask[y1:y2 + 1, x1:x2 + 1] = True
            pred = InstanceData()
            pred.bboxes = boxes
            pred.scores = torch.linspace(0.9, 0.3, n) * (0.5 + level % 0.5)
            pred.labels = labels
            pred.masks = masks
            sample.pred_instances = pred
        return batch_data_samples

    def loss(self, batch_inputs, batch_data_samples):
        raise NotImplementedError

    def _forward(self, batch_inputs, batch_data_samples=None):
        raise NotImplementedError

    def extract_feat(self, batch_inputs):
        raise NotImplementedError


def _run(tmp_path, name, **options):
    from mmrobust.apis import apply_common_args, build_runner
    from mmrobust.corruptions import resolve_protocol
    from mmrobust.evaluation import RobustnessOptions, evaluate_robustness
    cfg = Config.fromfile(str(REPO / DEMO_DET_CFG))
    cfg = apply_common_args(cfg, str(REPO / DEMO_DET_CFG), 'none', str(tmp_path / name),
                            {'test_dataloader.num_workers': 1,
                             'test_dataloader.persistent_workers': False,
                             'test_dataloader.batch_size': 2,
                             'test_dataloader.dataset.indices': 6})
    cfg.model = dict(type='OverlapStub')
    runner = build_runner(cfg, ('test_dataloader', ))
    runner.call_hook('before_run')
    path = tmp_path / f'{name}.json'
    data = evaluate_robustness(runner, cfg, resolve_protocol(None, ['gaussian_noise', 'fog'],
                                                             [2]),
                               str(path), RobustnessOptions(progress=False, **options))
    stats = sorted((tmp_path / f'{name}_per_image').rglob('*'))
    return data, {p.name: p.read_bytes() for p in stats if p.is_file()}


def test_overlapped_loop_scores_as_the_serial_loop(toy_data, tmp_path):
    """The overlapped loop gives the serial loop's numbers.

    Prefetch and post-processing threads (one dataloader for all cells, and one per cell) give every
    cell the serial loop's numbers and per-image statistics, byte for byte; the ground-truth masks,
    which the COCO metric does not read, are not decoded.
    """
    serial, serial_stats = _run(tmp_path, 'serial', post_process_queue=0, prefetch=0,
                                metric_queue=0)
    assert serial['cells']['clean']['0']['coco/segm_mAP'] > 0
    assert serial['cells']['clean']['0'] != serial['cells']['fog']['2']  # the cells differ
    assert serial['gt_masks'].startswith('not decoded')
    for one_pass in (True, False):
        overlapped, stats = _run(tmp_path, f'overlap{one_pass}', post_process_queue=2,
                                 prefetch=2, metric_queue=0, one_pass=one_pass)
        assert overlapped['cells'] == serial['cells']
        assert stats == serial_stats and stats
        for timing in (overlapped['timing'][c][s] for c in overlapped['timing']
                       for s in overlapped['timing'][c]):
            assert timing['post_process_wait_s'] >= 0


def test_gt_masks_stay_where_a_metric_may_read_them():
    from mmrobust.evaluation.evaluator_cfg import without_unread_gt_masks
    cfg = Config.fromfile(str(REPO / DEMO_DET_CFG))
    ann = cfg.test_evaluator.get('ann_file')
    assert ann

    def mask_flags(c):
        return [s.get('with_mask') for s in c.test_dataloader.dataset.pipeline
                if s['type'] == 'LoadAnnotations']

    light, note = without_unread_gt_masks(cfg, cfg.test_evaluator)
    assert note.startswith('not decoded') and mask_flags(light) == [False]
    assert mask_flags(cfg) == [True]  # the config itself is not changed (attack cells use it)
    kept, note = without_unread_gt_masks(cfg, [cfg.test_evaluator,
                                               dict(type='mmdet.VOCMetric')])
    assert kept is cfg and note == 'decoded (VOCMetric may read them)'
    no_file = dict(cfg.test_evaluator, ann_file=None)
    assert without_unread_gt_masks(cfg, no_file)[1] == 'decoded (CocoMetric may read them)'
    cfg.test_dataloader.dataset.pipeline = [s for s in cfg.test_dataloader.dataset.pipeline
                                            if s['type'] != 'LoadAnnotations']
    assert without_unread_gt_masks(cfg, cfg.test_evaluator) == (cfg, None)



def test_run_computes_the_metrics_after_every_batch_is_post_processed():
    """``OverlappedTestLoop.run()`` drains its post-processing queue before ``evaluate``.

    mmengine's ``TestLoop.run``, which it inherited, would have computed the metrics with batches
    still waiting in the queue (and left its thread running).
    """
    from mmrobust.evaluation.loop import OverlappedTestLoop

    class Evaluator(_Recorder):
        def evaluate(self, size):
            return {'seen_at_evaluate': list(self.seen), 'size': size}

    class Runner:
        hooks = []

        def call_hook(self, name, **kwargs):
            self.hooks.append(name)

    class Model(torch.nn.Module):
        def test_step(self, batch):
            return [batch]

    runner = Runner()
    runner.model = Model()
    data = torch.utils.data.DataLoader(list(range(8)), batch_size=None)
    evaluator = Evaluator(delay=0.02)
    loop = OverlappedTestLoop(runner, data, evaluator, post_process_queue=3, prefetch=0)
    metrics = loop.run()
    assert metrics == {'seen_at_evaluate': list(range(8)), 'size': 8}
    assert runner.hooks[:2] == ['before_test', 'before_test_epoch']
    assert runner.hooks[-2:] == ['after_test_epoch', 'after_test']
    assert loop.post_process._thread is None  # NOTE: ended
