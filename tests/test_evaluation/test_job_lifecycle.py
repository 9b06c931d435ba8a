"""A robustness job as a cluster runs it (#65).

Killed and resubmitted, with the metrics mmdet and mmseg ship, optional imports, broken results
files and stored sets without a manifest.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_background_metric import _start, _wait_for
from test_robustness import SEG_CFG, _cells, _init_checkpoint

from helpers import REPO, assert_user_error, run_tool, run_tool_here, run_tool_in_process
from helpers.harness import descendants

MASK_RCNN = 'configs/toy/mask-rcnn_r18_fpn_toy-coco.py'


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs (zombies wait for the subreaper: they don't)."""
    states = subprocess.run(['ps', '-o', 'stat=', '-g', str(pgid)], capture_output=True,
                            text=True).stdout.split()
    return any(not state.startswith('Z') for state in states)


def _wait_group_gone(pgid: int, timeout: float) -> float:
    """Seconds until no process of the group is left (fails the test after ``timeout``)."""
    start = time.monotonic()
    while _group_alive(pgid):
        if time.monotonic() - start > timeout:
            left = subprocess.run(['ps', '-o', 'pid,ppid,stat,cmd', '-g', str(pgid)],
                                  capture_output=True, text=True).stdout
            os.killpg(pgid, signal.SIGKILL)
            pytest.fail(f'processes of the killed run still alive after {timeout} s:\n{left}')
        time.sleep(0.1)
    return time.monotonic() - start


# -- 1. a killed run leaves no lock holder and no orphan -----------------------------------------

_LOCK_HOLDER = textwrap.dedent('''
    import multiprocessing, os, sys, time
    from mmrobust.utils.io import exclusive_lock
    if sys.argv[2] == 'guard':
        from mmrobust.utils.processes import children_die_with_parent
        children_die_with_parent()

    def blocked_worker(write_end):
        os.write(write_end, b'x' * (1 << 20))  # a full pipe that nobody reads: blocks for ever

    with exclusive_lock(sys.argv[1]):
        read_end, write_end = os.pipe()
        child = multiprocessing.get_context('fork').Process(target=blocked_worker,
                                                            args=(write_end, ))
        child.start()
        print(child.pid, flush=True)
        time.sleep(600)
''')


@pytest.mark.parametrize('sig', [signal.SIGKILL, signal.SIGTERM], ids=['kill-9', 'term'])
def test_a_killed_holders_forked_children_hold_no_lock_and_die_with_it(tmp_path, sig):
    from mmrobust.utils import FileLockedError, exclusive_lock
    target = tmp_path / 'r.json'
    proc = subprocess.Popen([sys.executable, '-c', _LOCK_HOLDER, str(target), 'guard'],
                            cwd=REPO, env={**os.environ, 'PYTHONPATH': str(REPO)},
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert int(proc.stdout.readline()) > 0  # its child is forked, and blocked in a write
    os.kill(proc.pid, sig)  # the holder only, as `timeout` and a scheduler's first signal do
    proc.wait()
    try:
        with exclusive_lock(target):  # at once: the blocked child does not hold it
            pass
    except FileLockedError as err:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f'a forked child of the killed holder keeps its lock: {err}')
    assert _wait_group_gone(proc.pid, 10) < 10


def test_without_the_guard_the_lock_is_still_free(tmp_path):
    """A process that does not ask its children to die with it still shares no lock with them."""
    from mmrobust.utils import exclusive_lock
    target = tmp_path / 'r.json'
    proc = subprocess.Popen([sys.executable, '-c', _LOCK_HOLDER, str(target), 'plain'],
                            cwd=REPO, env={**os.environ, 'PYTHONPATH': str(REPO)},
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    try:
        with exclusive_lock(target):
            pass
    finally:
        os.kill(child, signal.SIGKILL)  # NOTE: an orphan by design here
        _wait_group_gone(proc.pid, 10)


def _mask_rcnn_args(config: Path, ckpt: Path, results: Path, work: Path) -> list:
    return [config, ckpt, '--corruptions', 'fog', 'snow', '--severities', '1', '2', '--results',
            results, '--work-dir', work, '--cfg-options', 'test_dataloader.num_workers=2',
            'test_dataloader.persistent_workers=True', 'test_dataloader.dataset.indices=4']


def _mask_rcnn_with_masks_read(tmp_path: Path) -> Path:
    """The toy Mask R-CNN with a second metric that may read the ground truth.

    So the dataloader workers decode the ground-truth masks (large batches: a worker's write into
    its pipe blocks until the loop reads it).
    """
    config = tmp_path / 'mask_rcnn_dump.py'
    config.write_text(textwrap.dedent(f'''
        _base_ = ['{REPO / MASK_RCNN}']
        test_evaluator = [
            dict(type='CocoMetric', metric=['bbox', 'segm'],
                 ann_file='data/toy_coco/annotations/instances_val2017.json'),
            dict(type='DumpDetResults', out_file_path='{tmp_path / "dump.pkl"}')]
        # COCO's 100 detections per image (the toy config keeps 20): only among that many does
        # the untrained model score above 0 anywhere, which the resumed run's equality needs
        model = dict(test_cfg=dict(rcnn=dict(max_per_img=100)))
        '''))
    return config


@pytest.mark.slow
def test_a_run_killed_mid_cell_resumes_at_once_to_an_uninterrupted_runs_numbers(toy_data,
                                                                                tmp_path):
    from mmrobust.evaluation.metric_worker import DELAY_ENV, WORKER_NAME
    ckpt = _init_checkpoint(MASK_RCNN, tmp_path / 'mask.pth')
    config = _mask_rcnn_with_masks_read(tmp_path)
    whole = tmp_path / 'whole.json'
    out = run_tool_here('test_robustness.py',
                        *_mask_rcnn_args(config, ckpt, whole, tmp_path / 'w0'))
    assert 'ground-truth masks of the corruption and shift cells: decoded' in \
        out.stdout + out.stderr
    results = tmp_path / 'killed.json'
    args = _mask_rcnn_args(config, ckpt, results, tmp_path / 'w1')
    predictions = tmp_path / 'killed_predictions'

    # 1. kill -9 of the main process (not its group) while the metrics wait in the worker and
    # the dataloader workers load the next cell
    proc = _start(args, {DELAY_ENV: '600'})
    _wait_for(lambda: len(list(predictions.glob('*.pkl'))) >= 2, proc, 'two saved cells')
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()  # NOTE: not communicate(): an orphan would hold its output pipes open
    assert _wait_group_gone(proc.pid, 15) < 15  # no worker outlives it
    proc.communicate()

    # 2. the resubmitted run starts at once, and a scheduler's SIGTERM stops it mid-cell
    proc = _start(args, {})

    def loading() -> bool:
        workers = [cmd for cmd in descendants(proc.pid, singletons=False).values()
                   if not cmd.startswith(f'[{WORKER_NAME}]')]
        return len(workers) >= 2 and len(_cells(results) if results.exists() else {}) >= 2
    _wait_for(loading, proc, 'the dataloader workers of an inferred cell')
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait()
    assert _wait_group_gone(proc.pid, 15) < 15
    _, err = proc.communicate()
    assert 'is being written by' not in err

    # 3. the next one finishes: the numbers of the uninterrupted run
    resumed = subprocess.run(
        [sys.executable, str(REPO / 'tools' / 'test_robustness.py'), *map(str, args)],
        cwd=REPO, env={**os.environ, 'PYTHONPATH': str(REPO)}, capture_output=True, text=True,
        timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _cells(results) == _cells(whole)
    assert any(v > 0 for cell in _cells(whole).values() for sev in cell.values()
               for v in sev.values())  # numbers that could differ


# -- 2. mmdet's multi-process COCO evaluation in the metric worker -------------------------------

def test_every_coco_backend_computes_in_the_worker_as_in_the_loop(tmp_path):
    """The worker (not a daemon) may start mmdet-mp's pool; numbers equal the loop's."""
    import torch

    from mmrobust.evaluation.coco_metric import COCO_BACKENDS
    from mmrobust.evaluation.metric_worker import MetricWorker, compute_metrics
    from mmrobust.evaluation.predictions_file import predictions_path, save_cell_predictions
    from mmrobust.registry import METRICS
    gt, dets = _small_coco(tmp_path)
    meta = {'classes': tuple(c['name'] for c in gt['categories'])}
    worker = MetricWorker('mmdet', ['mmrobust'])
    try:
        for backend in COCO_BACKENDS:
            cfg = dict(type='RobustCocoMetric', ann_file=str(tmp_path / 'gt.json'),
                       metric=['bbox'], backend=backend)
            here = METRICS.build(dict(cfg))
            here.dataset_meta = meta
            here.process({}, [{'img_id': d['img_id'], 'ori_shape': d['ori_shape'],
                               'pred_instances': {k: torch.from_numpy(d[k]) for k in (
                                   'bboxes', 'scores', 'labels')}} for d in dets])
            parts = [list(here.results)]
            expected = compute_metrics([here], parts)
            path = predictions_path(str(tmp_path / 'p'), backend, 1)
            save_cell_predictions(path, 'id', backend, 1, parts, meta, {})
            got, _, _ = worker.submit(path, [cfg]).result()
            assert got == expected, backend
            assert expected['coco/bbox_mAP'] > 0.05
    finally:
        worker.close()


def test_metric_workers_are_forked_by_one_server_in_the_environment_they_were_asked_in(
        tmp_path, monkeypatch):
    """Every metric worker of a process comes from its fork server (the imports paid once).

    Each runs in the environment of the moment it was asked for (not the server's, older), and
    is named for ``ps``; the second one's parent is the first one's.
    """
    from mmrobust.evaluation.metric_worker import WORKER_NAME, MetricWorker
    from mmrobust.evaluation.predictions_file import predictions_path, save_cell_predictions

    from helpers.process_probe import PROBE_ENV
    path = predictions_path(str(tmp_path / 'p'), 'probe', 1)
    save_cell_predictions(path, 'id', 'probe', 1, [[{}]], {}, {})
    seen = []
    for value in ('1', '2'):
        monkeypatch.setenv(PROBE_ENV, value)
        worker = MetricWorker(None, ['helpers.process_probe'])
        try:
            seen.append(worker.submit(path, [dict(type='ProcessProbeMetric')]).result()[0])
        finally:
            worker.close()
    assert [s['env'] for s in seen] == [1.0, 2.0]
    assert seen[0]['pid'] != seen[1]['pid'] and os.getpid() not in (s['pid'] for s in seen)
    assert seen[0]['ppid'] == seen[1]['ppid'] != os.getpid()  # forked by the server, not by us
    assert [s['name'] for s in seen] == [WORKER_NAME] * 2


def _small_coco(tmp_path: Path):
    """A COCO ground truth with 12 images and noisy detections of it."""
    import numpy as np
    rng = np.random.default_rng(0)
    images, anns, dets = [], [], []
    for i in range(12):
        images.append({'id': i, 'width': 64, 'height': 48, 'file_name': f'{i}.jpg'})
        boxes, labels = [], []
        for k in range(3):
            x, y = rng.uniform(0, 40), rng.uniform(0, 28)
            w, h = rng.uniform(8, 20), rng.uniform(8, 18)
            cat = int(rng.integers(1, 3))
            anns.append({'id': len(anns) + 1, 'image_id': i, 'category_id': cat,
                         'bbox': [x, y, w, h], 'area': w * h, 'iscrowd': 0})
            boxes.append([x + rng.normal(0, 1), y + rng.normal(0, 1), x + w, y + h])
            labels.append(cat - 1)
        dets.append({'img_id': i, 'ori_shape': (48, 64),
                     'bboxes': np.array(boxes, np.float32),
                     'scores': rng.uniform(0.3, 1, 3).astype(np.float32),
                     'labels': np.array(labels)})
    gt = {'images': images, 'annotations': anns,
          'categories': [{'id': 1, 'name': 'a'}, {'id': 2, 'name': 'b'}]}
    (tmp_path / 'gt.json').write_text(json.dumps(gt))
    return gt, dets


# -- 3. metrics that write files in process() ----------------------------------------------------

@pytest.mark.slow
def test_mmsegs_cityscapes_metric_reads_its_files_with_the_default_queue(toy_data, tmp_path):
    """mmseg's CityscapesMetric (files in process, removed with the object) gives test.py's."""
    import re
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')

    def options(out: str) -> list:
        return ['--cfg-options', 'test_dataloader.num_workers=1',
                'test_dataloader.persistent_workers=False', 'test_dataloader.dataset.indices=4',
                'test_evaluator.type=CityscapesMetric', f'test_evaluator.output_dir={out}']
    cells = {}
    for queue in ('2', '0'):
        results = tmp_path / f'q{queue}.json'
        out = run_tool_here('test_robustness.py', SEG_CFG, ckpt, '--corruptions', 'fog',
                            '--severities', '2', '--results', results, '--metric-queue', queue,
                            '--work-dir', tmp_path / f'w{queue}',
                            *options(str(tmp_path / f'cs{queue}')))
        cells[queue] = _cells(results)
        if queue != '0':
            assert 'computed in this process right after its inference' in out.stdout + out.stderr
            assert json.loads(results.read_text())['metric_queue'].startswith('0, not 2')
    assert cells['2'] == cells['0']
    score = cells['2']['clean']['0']['averageScoreCategories']
    assert score == score and score > 0  # not NaN: the files were read
    plain = run_tool_here('test.py', SEG_CFG, ckpt, '--work-dir', tmp_path / 'plain',
                          *options(str(tmp_path / 'cs_plain')))
    logged = float(re.findall(r'averageScoreCategories: ([0-9.]+)',
                              plain.stdout + plain.stderr)[-1])
    assert logged == pytest.approx(score, abs=6e-5)


def _mask_rcnn_on_toy_cityscapes(tmp_path: Path) -> Path:
    """The toy Mask R-CNN with mmdet's Cityscapes instance data and metrics (its own configs')."""
    config = tmp_path / 'mask_rcnn_cityscapes.py'
    root = 'data/toy_cityscapes/'
    config.write_text(textwrap.dedent(f'''
        _base_ = ['{REPO / MASK_RCNN}']
        model = dict(roi_head=dict(bbox_head=dict(num_classes=8), mask_head=dict(num_classes=8)))
        test_dataloader = dict(dataset=dict(
            _delete_=True, type='CityscapesDataset', data_root='{root}', test_mode=True,
            ann_file='annotations/instancesonly_filtered_gtFine_val.json',
            data_prefix=dict(img='leftImg8bit/val/'),
            pipeline=[
                dict(type='LoadImageFromFile'),
                dict(type='Resize', scale=(512, 256), keep_ratio=True),
                dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
                dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape',
                                                      'img_shape', 'scale_factor'))]))
        test_evaluator = [
            dict(type='CocoMetric', metric=['bbox', 'segm'],
                 ann_file='{root}annotations/instancesonly_filtered_gtFine_val.json'),
            dict(type='CityScapesMetric', seg_prefix='{root}gtFine/val',
                 outfile_prefix='{tmp_path / "cityscapes_metric"}')]
        '''))
    return config


@pytest.mark.slow
def test_mmdets_cityscapes_metric_keeps_its_files_with_the_default_queue(toy_data, tmp_path):
    """mmdet's CityScapesMetric (empties its folder when built) gives test.py's numbers."""
    import re
    config = _mask_rcnn_on_toy_cityscapes(tmp_path)
    ckpt = _init_checkpoint(str(config), tmp_path / 'mask.pth')
    options = ['--cfg-options', 'test_dataloader.num_workers=1',
               'test_dataloader.persistent_workers=False', 'test_dataloader.dataset.indices=3']
    cells = {}
    for queue in ('2', '0'):
        results = tmp_path / f'q{queue}.json'
        run_tool_here('test_robustness.py', config, ckpt, '--corruptions', 'fog', '--severities',
                      '2', '--results', results, '--metric-queue', queue, '--work-dir',
                      tmp_path / f'w{queue}', *options)
        cells[queue] = _cells(results)
    assert cells['2'] == cells['0']
    clean = cells['2']['clean']['0']
    assert 'cityscapes/mAP' in clean and 'coco/bbox_mAP' in clean
    # NOTE: an untrained detector scores 0; what is checked is that each cell's metric read the
    # files it wrote (mmdet's own rerun of the worker would have emptied the folder first)
    written = sorted(p.name for p in (tmp_path / 'cityscapes_metric_fog_2' / 'results').glob(
        '*_pred.txt'))
    assert len(written) == 3, written
    plain = run_tool_here('test.py', config, ckpt, '--work-dir', tmp_path / 'plain', *options)
    for key in ('cityscapes/mAP', 'coco/bbox_mAP', 'coco/segm_mAP'):
        logged = float(re.findall(re.escape(key) + r': ([0-9.]+)', plain.stdout + plain.stderr)[-1])
        assert logged == pytest.approx(clean[key], abs=6e-5), key


def test_file_writing_metrics_are_known_by_scoped_names_too():
    from mmrobust.evaluation.evaluator_cfg import side_file_metrics
    for kind in ('CityscapesMetric', 'mmseg.CityscapesMetric', 'mmdet.CityScapesMetric'):
        assert kind.split('.')[-1] in side_file_metrics(dict(type=kind, output_dir='x'))
    assert side_file_metrics([dict(type='mmdet.CocoMetric')]) is None


# -- 4. a stored set without a manifest ----------------------------------------------------------

def _stored(root: Path, value: int, size: int = 10) -> Path:
    for corruption in ('fog', 'snow'):
        folder = root / corruption / '2' / 'val2017'
        folder.mkdir(parents=True)
        for i in range(3):
            (folder / f'{i}.jpg').write_bytes(bytes([value]) * (size + i))
    return root


def test_a_set_without_manifest_is_known_by_its_content(tmp_path, monkeypatch):
    import shutil

    from mmrobust.corruptions import resolve_protocol
    from mmrobust.corruptions.stored import stored_content_identity
    from mmrobust.evaluation import ResultsMismatchError, RobustnessResults
    from mmrobust.evaluation.cell_kinds import RunSpec
    from mmrobust.evaluation.results import run_identity
    cells = [('fog', 2), ('snow', 2)]
    a = stored_content_identity(str(_stored(tmp_path / 'a', 1)), cells)
    b = stored_content_identity(str(_stored(tmp_path / 'b', 2, size=11)), cells)
    shutil.copytree(tmp_path / 'a', tmp_path / 'copy')
    copy = stored_content_identity(str(tmp_path / 'copy'), cells)
    assert a == copy and a != b and a['files'] == 6 and a['manifest'] is False
    protocol = resolve_protocol(None, ['fog', 'snow'], [2])

    def identity(root: str, stored: dict) -> dict:
        return run_identity(RunSpec(protocol, 0, False, stored_set=stored, corrupted_root=root),
                            config='c.py', config_sha256='c', checkpoint='')
    import mmengine.logging
    logged = []
    monkeypatch.setattr(mmengine.logging, 'print_log', lambda msg, **kw: logged.append(msg))
    path = str(tmp_path / 'r.json')
    first = RobustnessResults(path, identity(str(tmp_path / 'a'), a))
    first.record('fog', 2, {'bbox_mAP': 0.041}, {})
    with pytest.raises(ResultsMismatchError, match='stored_set'):
        RobustnessResults(path, identity(str(tmp_path / 'b'), b))  # another set: not relabelled
    moved = RobustnessResults(path, identity(str(tmp_path / 'copy'), copy))  # the same set
    assert moved.done('fog', 2)
    assert any(f"recorded corrupted_root {str(tmp_path / 'a')!r}" in m for m in logged), logged


# -- 5. optional custom imports ------------------------------------------------------------------

def test_optional_custom_imports_that_failed_are_left_out_and_required_ones_checked_first():
    from mmrobust.evaluation.metric_worker import worker_imports
    from mmrobust.utils.errors import ConfigError
    optional = dict(imports=['os', 'mmrobust_no_such_module'], allow_failed_imports=True)
    assert worker_imports([dict(type='IoUMetric')], optional, 'mmseg') == [
        'os', 'mmseg.evaluation.metrics.iou_metric']
    with pytest.raises(ConfigError, match="'mmrobust_no_such_module', which cannot be imported"):
        worker_imports([dict(type='IoUMetric')], dict(imports=['mmrobust_no_such_module']),
                       'mmseg')


@pytest.mark.slow
def test_a_config_with_a_failed_optional_import_runs_with_the_worker(toy_data, tmp_path):
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')
    config = tmp_path / 'optional.py'
    config.write_text(f"_base_ = ['{REPO / SEG_CFG}']\ncustom_imports = dict(imports=["
                      "'mmrobust', 'mmrobust_no_such_module'], allow_failed_imports=True)\n")
    results = tmp_path / 'r.json'
    out = run_tool_here('test_robustness.py', config, ckpt, '--corruptions', 'fog', '--severities',
                        '2', '--results', results, '--work-dir', tmp_path / 'w', '--cfg-options',
                        'test_dataloader.num_workers=1', 'test_dataloader.persistent_workers=False',
                        'test_dataloader.dataset.indices=2')
    assert sorted(_cells(results)) == ['clean', 'fog']
    assert "'mmrobust_no_such_module' failed (No module named" in \
        out.stdout + out.stderr


# -- 6. a results file that cannot be read -------------------------------------------------------

@pytest.mark.parametrize('content', ['{"format": "mmrobust-robus', '[1, 2]'],
                         ids=['truncated', 'a-list'])
def test_a_broken_results_file_is_one_error_line_naming_it(toy_data, tmp_path, content):
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')
    path = tmp_path / 'r.json'
    path.write_text(content)
    status, _, err = run_tool_in_process(
        'test_robustness.py', SEG_CFG, ckpt, '--corruptions', 'fog', '--severities', '1',
        '--results', path, '--work-dir', tmp_path / 'w', '--cfg-options',
        'test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False')
    assert_user_error(status, err, 1, str(path), 'cannot be resumed', 'Move it aside')
    assert path.read_text() == content  # nothing lost


# -- 7. a rerun with nothing left to do ----------------------------------------------------------

@pytest.mark.slow
def test_a_rerun_with_nothing_to_do_keeps_the_inferring_runs_loader_and_time(toy_data, tmp_path):
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')
    results = tmp_path / 'r.json'
    args = [SEG_CFG, ckpt, '--corruptions', 'fog', '--severities', '2', '--results', results,
            '--work-dir', tmp_path / 'w', '--cfg-options', 'test_dataloader.num_workers=1',
            'test_dataloader.persistent_workers=False', 'test_dataloader.dataset.indices=2']
    run_tool_here('test_robustness.py', *args)
    written = results.read_bytes()
    first = json.loads(written)
    assert first['time']['wall_s'] > 0 and first['loader'] == 'one-pass'
    out = run_tool_here('test_robustness.py', *args[:-4], '--per-cell-loaders', *args[-4:])
    again = json.loads(results.read_text())
    assert again['time'] == first['time'] and again['loader'] == first['loader']
    assert again['cells'] == first['cells'] and results.read_bytes() == written
    assert 'nothing to run, nothing written' in out.stdout + out.stderr


# -- 8. the guide's words on batches -------------------------------------------------------------

def test_the_guide_says_batch_padding_changes_a_detectors_predictions():
    from mmengine.config import Config

    from mmrobust.evaluation.robustness import config_sha256
    guide = (REPO / 'docs/en/user_guides/robustness_benchmarking.md').read_text()
    sentence = guide[guide.index('**The same attack in any batch.**'):]
    sentence = sentence[:sentence.index('\n- ')]
    words = ' '.join(sentence.split())
    assert 'attacked pixels are therefore identical' in words
    assert "the padding changes a detector's per-image outputs" in words
    cfg = Config.fromfile(str(REPO / MASK_RCNN))
    before = config_sha256(cfg)
    cfg.test_dataloader.batch_size = 2
    assert config_sha256(cfg) != before  # so a resume never mixes two batch sizes


@pytest.mark.slow
def test_the_worker_exit_benchmark_prints_both_start_methods_and_their_ratio():
    proc = run_tool('analysis_tools/benchmark_worker_exit.py', '--rounds', '1', '--moments',
                    'start-up')
    rows = [r for r in proc.stdout.splitlines() if r.startswith('| start-up |')]
    assert [r.split(' | ')[1] for r in rows] == ['the worker', 'every process'], proc.stdout
    for row in rows:  # seconds for both methods, and their ratio
        cells = row.strip('| ').split(' | ')[2:]
        assert len(cells) == 3 and all(float(c.split()[0]) > 0 for c in cells), row
