"""The robustness loop on several ranks (2-process gloo groups).

A rank without a batch in a cell, rank 0 waiting on its metric worker, the worker's imports and the
fork of the loader's workers.
"""
import os
from pathlib import Path

import pytest

from helpers import REPO, run_ranks

SEG_CFG = 'configs/toy/segformer_mit-b0_toy-cityscapes.py'


def _file_barrier(folder: Path, rank: int, world: int, limit: float = 300) -> None:
    """Every rank here before any goes on.

    Without a collective (whose timeout the tests keep short): a rank's set-up time on a loaded
    machine is not what they measure.
    """
    import time
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f'ready_{rank}').touch()
    deadline = time.monotonic() + limit
    while not all((folder / f'ready_{r}').exists() for r in range(world)):
        assert time.monotonic() < deadline, 'the other ranks never got ready'
        time.sleep(0.1)


def _evaluate(rank: int, world: int, config: str, ckpt: str, work: str, options: dict,
              corruptions: list, kwargs: dict) -> dict:
    """One rank of a robustness run of ``config`` (the cells of ``corruptions`` at severity 1).

    Rank 0 returns the results' cells.
    """
    os.chdir(REPO)
    from mmengine.config import Config

    from mmrobust.apis import apply_common_args, apply_test_args, build_runner
    from mmrobust.corruptions import resolve_protocol
    from mmrobust.evaluation import RobustnessOptions, evaluate_robustness
    cfg = Config.fromfile(str(REPO / config))
    cfg = apply_common_args(cfg, str(REPO / config), 'none', work, options)
    cfg = apply_test_args(cfg, ckpt)
    runner = build_runner(cfg, ('test_dataloader', ))
    runner.call_hook('before_run')
    runner.load_or_resume()
    if world > 1:  # NOTE: the ranks start the loop together, whatever their set-up took
        _file_barrier(Path(work), rank, world)
    data = evaluate_robustness(runner, cfg, resolve_protocol(None, corruptions, [1]),
                               str(Path(work) / 'results.json'),
                               RobustnessOptions(progress=False, **kwargs))
    return data.get('cells', {})


ONE_IMAGE = {'test_dataloader.num_workers': 0, 'test_dataloader.persistent_workers': False,
             'test_dataloader.dataset.indices': 1, 'test_dataloader.sampler.round_up': False}


def test_a_rank_without_a_batch_in_a_cell_takes_part_and_the_numbers_equal_one_ranks(
        toy_data, tmp_path, monkeypatch):
    """One image on 2 ranks with round_up=False: rank 1 has no batch in any cell.

    It gathers every cell with rank 0 (before, rank 0 waited in the gather until the group's
    timeout), and the cells equal a 1-rank run's.
    """
    from test_robustness import _init_checkpoint
    ckpt = str(_init_checkpoint(SEG_CFG, tmp_path / 'seg.pth'))
    args = (ONE_IMAGE, ['gaussian_noise', 'fog'], {'metric_queue': 0, 'per_image': False})
    two = run_ranks(_evaluate, SEG_CFG, ckpt, str(tmp_path / 'w2'), *args, limit=120,
                    group_timeout_s=20)[0]
    monkeypatch.chdir(REPO)
    one = _evaluate(0, 1, SEG_CFG, ckpt, str(tmp_path / 'w1'), *args)  # NOTE: in this process
    assert sorted(two) == ['clean', 'fog', 'gaussian_noise']
    assert two == one


@pytest.mark.slow
def test_ranks_wait_for_rank0s_metric_worker_in_short_polls(toy_data, tmp_path, monkeypatch):
    """The other rank waits for rank 0 in short broadcasts.

    Rank 0 waits 2 x 12 s on its metric worker (a full queue, then the last cell) in a group whose
    collectives time out after 8 s: the other rank waits in 1 s broadcasts (before, it sat in the
    final barrier until the group's timeout).
    """
    from test_robustness import _init_checkpoint

    from mmrobust.evaluation.metric_worker import DELAY_ENV
    ckpt = str(_init_checkpoint(SEG_CFG, tmp_path / 'seg.pth'))
    monkeypatch.setenv(DELAY_ENV, '12')  # NOTE: the ranks' metric worker inherits it
    cells = run_ranks(_evaluate, SEG_CFG, ckpt, str(tmp_path / 'w'), ONE_IMAGE, ['fog'],
                      {'metric_queue': 1, 'per_image': False}, limit=240, group_timeout_s=8)
    assert sorted(cells[0]) == ['clean', 'fog'] and cells[1] == {}


def test_rank0s_error_while_it_waits_reaches_every_rank(monkeypatch):
    """The other ranks take rank 0's outcome of each step: waiting, done, or its error."""
    from mmrobust.evaluation import rank0
    sent = iter([True, True, None, RuntimeError('disk full while saving fog 3')])
    rounds = []

    def from_rank0(box):
        rounds.append(box[0])
        box[0] = next(sent)
    monkeypatch.setattr(rank0, 'get_dist_info', lambda: (1, 2))
    monkeypatch.setattr(rank0, 'broadcast_object_list', from_rank0)
    rank0.rank0_until_done(None)
    assert rounds == [None, None, None]  # three rounds: waiting, waiting, done
    with pytest.raises(RuntimeError, match='disk full'):
        rank0.rank0_until_done(None)


def test_the_metric_worker_leaves_no_thread_in_the_loops_process(tmp_path):
    """A resume's dataloader workers find no foreign thread.

    The dataloader workers a resume forks after the metric worker started (its saved cells are
    handed over before inference) find no foreign thread: the worker talks through a pipe (a
    ProcessPoolExecutor kept a manager and a feeder thread).
    """
    import threading

    import torch

    from mmrobust.evaluation.metric_worker import MetricWorker
    from mmrobust.evaluation.predictions_file import predictions_path, save_cell_predictions
    path = predictions_path(str(tmp_path), 'fog', 1)
    areas = tuple(torch.ones(3) for _ in range(4))
    save_cell_predictions(path, 'x', 'fog', 1, [[areas]], {'classes': ('a', 'b', 'c')}, {})
    before = set(threading.enumerate())
    worker = MetricWorker('mmseg')
    try:
        job = worker.submit(path, [dict(type='IoUMetric', iou_metrics=['mIoU'])])
        assert set(threading.enumerate()) == before  # while the worker computes
        metrics, seconds, _ = job.result()
        assert metrics['mIoU'] == 100.0 and seconds > 0
        assert set(threading.enumerate()) == before
    finally:
        worker.close()


LAB_METRIC = '''
from mmseg.evaluation import IoUMetric
from mmseg.registry import METRICS


@METRICS.register_module(force=True)
class {name}(IoUMetric):
    """A lab's own metric, registered by a module of its own."""
'''


def test_a_metric_of_a_user_module_is_computed_by_the_worker(toy_data, tmp_path, monkeypatch):
    """The config's custom_imports register the metric.

    The worker imports them too (before, the run failed after the whole inference with 'not in the
    metric registry').
    """
    from test_robustness import _init_checkpoint
    (tmp_path / 'lab_metrics.py').write_text(LAB_METRIC.format(name='LabIoUMetric'))
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / 'lab.py'
    config.write_text(f'_base_ = [{str(REPO / SEG_CFG)!r}]\n'
                      "custom_imports = dict(imports=['lab_metrics'], allow_failed_imports=False)\n"
                      "test_evaluator = dict(_delete_=True, type='LabIoUMetric', "
                      "iou_metrics=['mIoU'])\n")
    ckpt = str(_init_checkpoint(SEG_CFG, tmp_path / 'seg.pth'))
    monkeypatch.chdir(REPO)
    cells = _evaluate(0, 1, str(config), ckpt, str(tmp_path / 'w'), ONE_IMAGE, ['fog'],
                      {'metric_queue': 1, 'per_image': False})
    assert sorted(cells) == ['clean', 'fog'] and 'mIoU' in cells['fog']['1']


def test_a_metric_the_worker_cannot_import_stops_before_inference(tmp_path):
    import importlib.util

    from mmrobust.evaluation.metric_worker import MetricClassError, worker_imports
    (tmp_path / 'hidden.py').write_text(LAB_METRIC.format(name='HiddenLabIoUMetric'))
    spec = importlib.util.spec_from_file_location('hidden_lab_metrics', tmp_path / 'hidden.py')
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # by path: not importable
    with pytest.raises(MetricClassError, match="HiddenLabIoUMetric is defined in "
                                               "'hidden_lab_metrics', which the metric worker"):
        worker_imports(dict(type='HiddenLabIoUMetric'), None, 'mmseg')
    assert worker_imports([dict(type='IoUMetric')], dict(imports=['os']), 'mmseg') == [
        'os', 'mmseg.evaluation.metrics.iou_metric']


def _det_sample(masks: int = 100, h: int = 480, w: int = 640) -> dict:
    """A Mask R-CNN sample as Evaluator.process hands it.

    Full-size elliptic masks, and the ground truth with its masks.
    """
    import numpy as np
    import torch
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:h, :w]
    cy, cx = rng.uniform(0, h, masks), rng.uniform(0, w, masks)
    ry, rx = rng.uniform(10, h / 3, masks), rng.uniform(10, w / 3, masks)
    full = np.stack([((yy - cy[i]) / ry[i]) ** 2 + ((xx - cx[i]) / rx[i]) ** 2 <= 1
                     for i in range(masks)])
    pred = {'bboxes': torch.rand(masks, 4) * 400, 'scores': torch.rand(masks),
            'labels': torch.randint(0, 80, (masks, )), 'masks': torch.from_numpy(full)}
    return {'img_id': 1, 'img_path': 'a.jpg', 'ori_shape': (h, w), 'pred_instances': pred,
            'gt_instances': {'masks': torch.from_numpy(full[:20]), 'labels': pred['labels'][:20]}}


def test_saved_predictions_are_compact_and_complete():
    """--save-predictions keeps RLE masks (as mmdet's DumpDetResults) and uint8 label maps.

    No logits and no ground truth: bytes per image measured against what DumpResults kept.
    """
    import pickle

    import numpy as np
    import torch
    from mmengine.evaluator.metric import _to_cpu
    from pycocotools import mask as mask_utils

    from mmrobust.evaluation.dump import DumpRobustPredictions, compact_sample
    det = _det_sample()
    raw, kept = pickle.dumps(_to_cpu(det)), compact_sample(det)
    small = pickle.dumps(kept)
    print(f'detection, 100 masks of 640x480: {len(raw)} -> {len(small)} bytes per image')
    assert len(small) < len(raw) / 100 and 'gt_instances' not in kept
    decoded = mask_utils.decode(kept['pred_instances']['masks']).transpose(2, 0, 1)
    assert np.array_equal(decoded, det['pred_instances']['masks'].numpy())
    assert np.array_equal(kept['pred_instances']['scores'], det['pred_instances']['scores'])

    labels = torch.randint(0, 19, (1, 512, 1024))
    seg = {'img_path': 'b.png', 'seg_logits': {'data': torch.rand(19, 512, 1024)},
           'pred_sem_seg': {'data': labels}, 'gt_sem_seg': {'data': labels.clone()}}
    raw, kept = pickle.dumps(_to_cpu(seg)), compact_sample(seg)
    small = pickle.dumps(kept)
    print(f'segmentation, 19 classes at 1024x512: {len(raw)} -> {len(small)} bytes per image')
    assert kept['pred_sem_seg']['data'].dtype == np.uint8
    assert np.array_equal(kept['pred_sem_seg']['data'], labels.numpy())
    assert set(kept) == {'img_path', 'pred_sem_seg'} and len(small) < 1024 * 512 + 1000
    wide = compact_sample({'pred_sem_seg': {'data': torch.tensor([[0, 300]])}})
    assert wide['pred_sem_seg']['data'].dtype == np.uint16

    dump = DumpRobustPredictions(out_file_path='x.pkl')
    dump.process({}, [det, seg])
    assert [set(r) for r in dump.results] == [set(compact_sample(det)), set(kept)]


FILES_METRIC = '''
import os
import uuid

from mmengine.evaluator import BaseMetric
from mmseg.registry import METRICS


@METRICS.register_module(force=True)
class LabFilesMetric(BaseMetric):
    """Writes a file per image as it processes and reads its folder back to compute, as
    mmseg's CityscapesMetric does."""

    def __init__(self, output_dir, **kwargs):
        super().__init__(**kwargs)
        self.output_dir = output_dir

    def process(self, data_batch, data_samples):
        os.makedirs(self.output_dir, exist_ok=True)
        for sample in data_samples:
            name = os.path.join(self.output_dir, uuid.uuid4().hex)
            with open(name, 'w') as f:
                f.write(sample['img_path'])
            self.results.append(name)

    def compute_metrics(self, results):
        return {'files': float(len(os.listdir(self.output_dir)))}
'''


@pytest.mark.parametrize('queue', [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_metric_that_writes_files_reads_only_its_cells(toy_data, tmp_path, monkeypatch, queue):
    """Three cells of two images.

    The metric right after each cell (queue 0) or a cell behind (queue 2, the worker waits 3 s):
    each cell's metric reads its own two files (before, one folder for every cell: a cell counted
    the files of the cells before it, or after it).
    """
    from test_robustness import _init_checkpoint

    from mmrobust.evaluation.metric_worker import DELAY_ENV
    (tmp_path / 'lab_files.py').write_text(FILES_METRIC)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(DELAY_ENV, '3')
    config = tmp_path / 'files.py'
    config.write_text(f'_base_ = [{str(REPO / SEG_CFG)!r}]\n'
                      "custom_imports = dict(imports=['lab_files'], allow_failed_imports=False)\n"
                      "test_evaluator = dict(_delete_=True, type='LabFilesMetric', "
                      f"output_dir={str(tmp_path / 'out')!r})\n")
    ckpt = str(_init_checkpoint(SEG_CFG, tmp_path / 'seg.pth'))
    monkeypatch.chdir(REPO)
    options = {**ONE_IMAGE, 'test_dataloader.dataset.indices': 2}
    cells = _evaluate(0, 1, str(config), ckpt, str(tmp_path / 'w'), options,
                      ['gaussian_noise', 'fog'], {'metric_queue': queue, 'per_image': False})
    assert {c: next(iter(by.values()))['files'] for c, by in cells.items()} == {
        'clean': 2.0, 'fog': 2.0, 'gaussian_noise': 2.0}
    assert sorted(p.name for p in (tmp_path / 'out').iterdir()) == [
        'clean_0', 'fog_1', 'gaussian_noise_1']
    import json
    assert json.loads((tmp_path / 'w' / 'results.json').read_text())['loader'].startswith(
        'per-cell (LabFilesMetric write files')


def test_format_only_is_refused_and_outputs_are_made_each_cells_own():
    from mmrobust.evaluation.evaluator_cfg import cell_metric_outputs, side_file_metrics
    from mmrobust.utils.errors import ConfigError
    with pytest.raises(ConfigError, match='CocoMetric is format_only'):
        side_file_metrics([dict(type='IoUMetric'), dict(type='CocoMetric', format_only=True)])
    assert side_file_metrics(dict(type='CocoMetric', outfile_prefix='x')) is None
    assert 'CityscapesMetric' in side_file_metrics(dict(type='mmseg.CityscapesMetric',
                                                        output_dir='o'))
    evaluator = cell_metric_outputs([dict(type='CocoMetric', outfile_prefix='r/x'),
                                     dict(type='CityscapesMetric', output_dir='o')], ('fog', 3))
    assert evaluator == [dict(type='CocoMetric', outfile_prefix='r/x_fog_3'),
                         dict(type='CityscapesMetric', output_dir='o/fog_3')]
