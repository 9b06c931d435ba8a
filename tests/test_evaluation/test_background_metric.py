"""The metric beside the next cell's inference.

Saved predictions, resuming, a dying worker, the plan rank 0 broadcasts, and the results file's
module.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mmengine.config import Config
from test_robustness import NO_WORKERS, SEG_CFG, _cells, _init_checkpoint

from mmrobust.evaluation import RESULTS_FORMAT, load_results
from mmrobust.evaluation.metric_worker import DELAY_ENV, WORKER_NAME
from mmrobust.evaluation.predictions_file import (
    predictions_path,
    save_cell_predictions,
    saved_cells,
)
from mmrobust.utils.io import TMP_MARK

from helpers import REPO, run_tool
from helpers.harness import descendants

CELLS = ['--corruptions', 'snow', '--severities', '2']


def test_saved_predictions_of_another_evaluation_are_not_used(tmp_path):
    for name, identity in (('clean', 'a'), ('fog', 'b')):
        save_cell_predictions(predictions_path(str(tmp_path), name, 1), identity, name, 1,
                              [[{'x': 1}]], {'classes': ('a', )}, {'inference_s': 1.0})
    (tmp_path / f'snow_1.pkl{TMP_MARK}123').write_bytes(b'half a file')
    (tmp_path / 'broken_1.pkl').write_bytes(b'not a pickle')
    found, foreign = saved_cells(str(tmp_path), 'a')
    assert found == {('clean', 1): str(tmp_path / 'clean_1.pkl')}
    assert sorted(Path(p).name for p in foreign) == ['broken_1.pkl', 'fog_1.pkl']


def test_predictions_round_trip_through_the_restricted_loader(tmp_path):
    import numpy as np
    import torch

    from mmrobust.evaluation.predictions_file import load_cell_predictions
    parts = [[{'bboxes': np.arange(8, dtype=np.float32).reshape(2, 4),
               'labels': np.array([1, 2]), 'score': np.float32(0.5),
               'masks': [{'size': [4, 5], 'counts': b'\x01abc'}]}],
             [(torch.arange(4.0), torch.ones(3, dtype=torch.bfloat16)[1:], 'a.png')]]
    path = predictions_path(str(tmp_path), 'fog', 3)
    save_cell_predictions(path, 'id', 'fog', 3, parts, {'classes': ('a', 'b')}, {'s': 1.0})
    got = load_cell_predictions(path)
    assert got['cell'] == ['fog', 3] and got['identity_sha256'] == 'id'
    assert got['dataset_meta'] == {'classes': ('a', 'b')} and got['timing'] == {'s': 1.0}
    det, seg = got['parts']
    assert np.array_equal(det[0]['bboxes'], parts[0][0]['bboxes'])
    assert det[0]['masks'] == parts[0][0]['masks'] and det[0]['score'] == np.float32(0.5)
    assert torch.equal(seg[0][0], torch.arange(4.0)) and seg[0][2] == 'a.png'
    assert seg[0][1].dtype == torch.bfloat16 and torch.equal(seg[0][1], torch.ones(2).bfloat16())


class _Opaque:
    """An object of a user's metric that no allow-list knows."""


def test_data_structures_are_kept_and_unknown_objects_refused_before_writing(tmp_path):
    """A metric's OpenMMLab data structures round-trip.

    A metric's OpenMMLab data structures (mmdet's BitmapMasks in the ground truth a DumpResults
    keeps) round-trip; an unknown object is refused while saving (the loop then computes that cell's
    metric in place), and no file is left.
    """
    import numpy as np
    from mmdet.structures.mask import BitmapMasks

    from mmrobust.evaluation.predictions_file import PredictionsPicklingError, load_cell_predictions
    path = predictions_path(str(tmp_path), 'fog', 3)
    masks = BitmapMasks(np.ones((2, 4, 5), np.uint8), 4, 5)
    save_cell_predictions(path, 'id', 'fog', 3, [[{'gt_masks': masks}]], {}, {})
    got = load_cell_predictions(path)['parts'][0][0]['gt_masks']
    assert isinstance(got, BitmapMasks) and np.array_equal(got.masks, masks.masks)
    with pytest.raises(PredictionsPicklingError, match='_Opaque is not allowed'):
        save_cell_predictions(predictions_path(str(tmp_path), 'snow', 1), 'id', 'snow', 1,
                              [[_Opaque()]], {}, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ['fog_3.pkl']


class _Evil:
    def __reduce__(self):
        return (os.system, ('echo pwned',))


def test_predictions_headers_are_read_without_unpickling_and_payloads_safely(tmp_path):
    """saved_cells reads a small header per file (never the payload).

    A payload naming anything but data is refused by the loader, nothing of it runs.
    """
    import pickle

    from mmrobust.evaluation.predictions_file import PREDICTIONS_FORMAT, load_cell_predictions
    path = tmp_path / 'fog_3.pkl'
    header = {'format': PREDICTIONS_FORMAT, 'identity_sha256': 'a', 'cell': ['fog', 3]}
    path.write_bytes(json.dumps(header).encode() + b'\n' + pickle.dumps({'parts': [_Evil()]}))
    found, unused = saved_cells(str(tmp_path), 'a')
    assert found == {('fog', 3): str(path)} and unused == []
    with pytest.raises(pickle.UnpicklingError, match='posix.system|os.system'):
        load_cell_predictions(str(path))


def test_orphan_and_old_format_predictions_are_not_used(tmp_path):
    """A file of this evaluation whose cell it does not plan.

    An attack cell after a rerun without attacks. And a file in the old general-pickle format, are
    listed as unused.
    """
    import pickle
    save_cell_predictions(predictions_path(str(tmp_path), 'pgd_linf', 1), 'a', 'pgd_linf', 1,
                          [[]], {}, {})
    save_cell_predictions(predictions_path(str(tmp_path), 'fog', 1), 'a', 'fog', 1, [[]], {}, {})
    (tmp_path / 'snow_1.pkl').write_bytes(pickle.dumps({
        'format': 'mmrobust-cell-predictions/1', 'identity_sha256': 'a', 'cell': ['snow', 1]}))
    found, unused = saved_cells(str(tmp_path), 'a', [('clean', 0), ('fog', 1), ('snow', 1)])
    assert found == {('fog', 1): str(tmp_path / 'fog_1.pkl')}
    assert sorted(Path(p).name for p in unused) == ['pgd_linf_1.pkl', 'snow_1.pkl']


def test_results_are_read_with_their_format_checked(tmp_path):
    path = tmp_path / 'r.json'
    path.write_text(json.dumps({'format': RESULTS_FORMAT, 'cells': {
        'clean': {'0': {'mIoU': 0.5}}, 'fog': {'3': {'mIoU': 0.4}}}}))
    assert load_results(str(path))['cells'] == {'clean': {0: {'mIoU': 0.5}},
                                                'fog': {3: {'mIoU': 0.4}}}
    path.write_text(json.dumps({'format': 'mmrobust-robustness/9', 'cells': {}}))
    with pytest.raises(ValueError, match="format 'mmrobust-robustness/9'.*reads"):
        load_results(str(path))


def test_every_rank_gets_rank0s_plan_and_its_error(monkeypatch):
    """Rank 0 alone reads the results file.

    The others take its plan, or raise its error, instead of planning from their own view of the
    file or waiting in a collective.
    """
    from mmrobust.evaluation import rank0
    from mmrobust.utils.io import ResultsMismatchError
    sent = rank0.Plan(infer=[('clean', 0), ('fog', 3)])

    def from_rank0(box):
        box[0] = sent
    monkeypatch.setattr(rank0, 'get_dist_info', lambda: (1, 2))
    monkeypatch.setattr(rank0, 'broadcast_object_list', from_rank0)
    assert rank0.broadcast_plan(None).infer == [('clean', 0), ('fog', 3)]
    sent = rank0.Plan(infer=[], error=ResultsMismatchError('r.json holds another'))
    with pytest.raises(ResultsMismatchError, match='holds another'):
        rank0.broadcast_plan(None)


def _start(args, env):
    """A tool run in its own process group (so the test can kill it and its worker at once)."""
    return subprocess.Popen(
        [sys.executable, str(REPO / 'tools' / 'test_robustness.py'), *map(str, args)],
        cwd=REPO, env={**os.environ, 'PYTHONPATH': str(REPO), **env}, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(condition, proc, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f'the run ended (exit {proc.returncode}) before {what}:\n{err[-3000:]}')
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f'no {what} after {timeout} s')
        time.sleep(0.2)


@pytest.mark.slow
def test_killed_run_and_dead_worker_resume_without_inference(toy_data, tmp_path, monkeypatch):
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')
    serial = tmp_path / 'serial.json'
    run_tool('test_robustness.py', SEG_CFG, ckpt, *CELLS, '--results', serial, '--work-dir',
             tmp_path / 'w0', '--metric-queue', '0', *NO_WORKERS)

    results = tmp_path / 'bg.json'
    saved = [tmp_path / 'bg_predictions' / 'clean_0.pkl',
             tmp_path / 'bg_predictions' / 'snow_2.pkl']
    args = [SEG_CFG, ckpt, *CELLS, '--results', results, '--work-dir', tmp_path / 'w1',
            *NO_WORKERS]
    slow = {DELAY_ENV: '600'}  # the worker sleeps before each cell: killed mid-metric

    # 1. kill -9 (the whole job, as a scheduler does) while the metrics are in flight
    proc = _start(args, slow)
    _wait_for(lambda: all(p.is_file() for p in saved), proc, 'predictions of both cells')
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert not results.exists() or not _cells(results)  # nothing recorded, both cells saved
    assert all(p.is_file() for p in saved)

    # 2. the rerun hands both cells to the worker, which dies: the run stops and says so
    proc = _start(args, slow)

    def worker_started():
        return any(cmd.startswith(f'[{WORKER_NAME}]') for cmd in descendants(proc.pid).values())
    _wait_for(worker_started, proc, 'a metric worker')
    for pid, cmd in descendants(proc.pid).items():
        if cmd.startswith(f'[{WORKER_NAME}]'):
            os.kill(pid, signal.SIGKILL)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail('the run waits on a dead metric worker')
    assert proc.returncode != 0
    # NOTE: killed as it starts, the worker may die before the run hands it the first cell (seen
    # once in 2 full-suite runs on a loaded machine): either way the message names that cell
    assert re.search(r'the metric worker died (while computing the metrics of|before it took) '
                     r'cell clean 0', err), err[-3000:]
    assert 'Rerun the same command' in err and str(saved[0]) in err
    assert 'Traceback' not in err and 'error: the metric worker died' in err  # a message
    assert all(p.is_file() for p in saved)

    # 3. the next rerun computes both metrics from the saved predictions: no forward at all
    from mmrobust.apis import apply_common_args, apply_test_args, build_runner
    from mmrobust.corruptions import resolve_protocol
    from mmrobust.evaluation import RobustnessOptions, evaluate_robustness
    cfg = Config.fromfile(str(REPO / SEG_CFG))
    cfg = apply_common_args(cfg, str(REPO / SEG_CFG), 'none', str(tmp_path / 'w3'),
                            {'test_dataloader.num_workers': 1,
                             'test_dataloader.persistent_workers': False})
    cfg = apply_test_args(cfg, str(ckpt))
    runner = build_runner(cfg, ('test_dataloader', ))
    runner.call_hook('before_run')
    runner.load_or_resume()

    def no_forward(*args, **kwargs):
        raise AssertionError('the model ran, though the predictions were saved')
    monkeypatch.setattr(runner.model, 'test_step', no_forward)
    data = evaluate_robustness(runner, cfg, resolve_protocol(None, ['snow'], [2]), str(results),
                               RobustnessOptions(checkpoint=str(ckpt), progress=False))
    assert data['cells'] == _cells(serial)
    assert data['timing']['snow']['2']['resumed_from_predictions'] is True
    assert data['timing']['snow']['2']['inference_s'] > 0  # measured by the killed run
    assert not saved[0].parent.exists()
