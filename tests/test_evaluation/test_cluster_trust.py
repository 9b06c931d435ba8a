"""Trust on a cluster: the results-file lock ends or waits on every rank alike.

With no rank left in a long collective, and releases only the lock file it holds.
"""
import json
import os
import threading
import time

import pytest

from mmrobust.utils import FileLockedError, exclusive_lock


def _lock_outcome(rank: int, world: int, target: str, wait: bool) -> tuple:
    """One rank of a 2-process gloo group: enter results_lock, say what happened."""
    from mmrobust.evaluation import results_lock
    start = time.monotonic()
    try:
        with results_lock(target, **(dict(wait=True, poll_s=0.2) if wait else {})):
            return 'entered', time.time()
    except Exception as err:  # what each rank ends with
        return f'{type(err).__name__}: {err}', time.monotonic() - start


def _two_ranks(target: str, wait: bool, timeout_s: float, limit: float = 60.0) -> dict:
    """``{rank: (outcome, seconds)}`` of 2 ranks whose collectives time out after ``timeout_s``.

    Launched by the suite's launcher (a rank that crashes fails the test).
    """
    from helpers import run_ranks
    return dict(enumerate(run_ranks(_lock_outcome, target, wait, limit=limit,
                                    group_timeout_s=timeout_s)))


def test_any_rank0_error_reaches_every_rank_at_once(tmp_path):
    """A lock that cannot be made stops both ranks with rank 0's message.

    A lock that cannot be made (here: its folder is a file) stops both ranks with rank 0's message;
    before, rank 1 sat in the broadcast until the process group's timeout.
    """
    (tmp_path / 'not_a_dir').write_text('a file')
    out = _two_ranks(str(tmp_path / 'not_a_dir' / 'r.json'), wait=False, timeout_s=30)
    for rank in (0, 1):
        what, seconds = out[rank]
        assert 'not_a_dir' in what and 'crashed' not in what, out
        assert seconds < 20, out


@pytest.mark.slow
def test_waiting_polls_so_no_rank_sits_in_a_long_collective(tmp_path):
    """--wait while another run holds the file.

    Both ranks poll in short rounds and enter together once it is released, though the group's
    timeout (3 s) is shorter than the wait.
    """
    target = tmp_path / 'r.json'
    held, released = threading.Event(), []

    def holder():
        with exclusive_lock(target):
            held.set()
            time.sleep(15)  # NOTE: the ranks start within ~5 s, then wait > the 3 s timeout
            released.append(time.time())
    thread = threading.Thread(target=holder)
    thread.start()
    held.wait()
    out = _two_ranks(str(target), wait=True, timeout_s=3)
    thread.join()
    assert out[0][0] == out[1][0] == 'entered', out
    assert out[0][1] >= released[0] and out[1][1] >= released[0]  # after the release


def test_release_removes_only_the_lock_file_it_holds(tmp_path):
    target = tmp_path / 'r.json'
    lock = tmp_path / 'r.json.lock'
    with exclusive_lock(target):
        os.remove(lock)  # e.g. an operator's clean-up; another run then locks a new file
        lock.write_text('{"pid": 1, "host": "elsewhere"}')
    assert lock.read_text() == '{"pid": 1, "host": "elsewhere"}'  # not ours: kept


def test_a_failed_unlink_does_not_hide_the_real_error(tmp_path):
    target = tmp_path / 'r.json'
    with pytest.raises(ValueError, match='the real error'):
        with exclusive_lock(target):
            os.remove(tmp_path / 'r.json.lock')
            raise ValueError('the real error')


def test_a_lock_file_naming_another_host_is_reported(tmp_path):
    """Flock may be node-local on a cluster file system.

    A lock file that names a holder on another host (left by a run there, maybe still going) is
    said, not silently taken over.
    """
    target = tmp_path / 'r.json'
    (tmp_path / 'r.json.lock').write_text(json.dumps({
        'pid': 4242, 'host': 'node-elsewhere', 'user': 'u', 'since': 'then', 'command': 'c'}))
    messages = []
    with exclusive_lock(target, waiting=messages.append):
        pass
    assert any('node-elsewhere' in m and 'node-local' in m for m in messages), messages
    with pytest.raises(FileLockedError):  # a live holder on this host still refuses
        with exclusive_lock(target):
            with exclusive_lock(target):
                pass


# -- strict loading by mmengine's own rules --------------------------------------------------------

class _Logger:
    def __init__(self):
        self.lines = []

    def info(self, msg):
        self.lines.append(msg)

    warning = info


class _Runner:
    def __init__(self, model):
        self.model, self.logger = model, _Logger()


def _bn_model():
    import torch
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))


def test_missing_batchnorm_counters_load_as_in_mmengine():
    from mmrobust.engine import StrictLoadHook
    model = _bn_model()
    state = {k: v for k, v in model.state_dict().items() if 'num_batches_tracked' not in k}
    hook = StrictLoadHook()
    hook.after_load_checkpoint(_Runner(model), {'state_dict': state})
    assert hook.last_load == {'matched': len(state), 'missing': [], 'unexpected': [],
                              'errors': []}


def test_a_module_that_remaps_its_keys_loads():
    """Keys renamed in a module's own ``_load_from_state_dict`` load.

    e.g. mmcv's deformable convolutions and old BatchNorm versions rename keys in their own
    ``_load_from_state_dict``: mmengine loads them completely, and so must the check.
    """
    import torch

    from mmrobust.engine import StrictLoadHook

    class Renamed(torch.nn.Linear):
        def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
            old = prefix + 'old_weight'
            if old in state_dict:
                state_dict[prefix + 'weight'] = state_dict.pop(old)
            super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
    model = torch.nn.Sequential(Renamed(2, 3))
    state = {'0.old_weight': torch.ones(3, 2), '0.bias': torch.zeros(3)}
    StrictLoadHook().after_load_checkpoint(_Runner(model), {'state_dict': state})
    assert '0.old_weight' in state  # the check changed nothing it was given
    assert float(model[0].weight.sum()) != 6.0  # and loaded nothing: mmengine does that


def test_the_check_runs_after_hooks_that_adapt_the_checkpoint():
    from mmengine.hooks import Hook
    from mmengine.runner.priority import get_priority

    from mmrobust.engine import StrictLoadHook
    from mmrobust.models.checkpoint import CheckpointMismatchError
    model = _bn_model()

    class Adapt(Hook):  # renames an old layout's keys, as a converter hook would
        priority = 'HIGH'

        def after_load_checkpoint(self, runner, checkpoint):
            checkpoint['state_dict'] = {k.replace('backbone.', ''): v
                                        for k, v in checkpoint['state_dict'].items()}
    old = {f'backbone.{k}': v for k, v in model.state_dict().items()}
    hooks = sorted([StrictLoadHook(), Adapt()], key=lambda h: get_priority(h.priority))
    runner, checkpoint = _Runner(model), {'state_dict': old}
    for hook in hooks:  # the runner's order: by priority
        hook.after_load_checkpoint(runner, checkpoint)
    # and a real mismatch is still refused, with the keys
    with pytest.raises(CheckpointMismatchError, match='unexpected keys.*extra'):
        StrictLoadHook().after_load_checkpoint(
            _Runner(model), {'state_dict': {**model.state_dict(), 'extra': model[0].bias}})


def test_a_partial_load_records_what_happened():
    from mmrobust.engine import StrictLoadHook
    model = _bn_model()
    state = dict(model.state_dict())
    state.pop('0.bias')
    hook = StrictLoadHook(allow_partial=True)
    runner = _Runner(model)
    hook.after_load_checkpoint(runner, {'state_dict': state})
    assert hook.last_load['missing'] == ['0.bias'] and hook.last_load['matched'] == len(state)
    assert 'PARTIAL LOAD' in runner.logger.lines[-1]


@pytest.mark.slow
def test_test_tool_loads_a_checkpoint_without_batchnorm_counters(toy_data, tmp_path):
    """tools/test.py loads it as mmengine does.

    Before: refused, 'missing keys ... num_batches_tracked'.
    """
    import torch
    from test_robustness import NO_WORKERS, SEG_CFG, _init_checkpoint

    from helpers import run_tool
    ckpt = _init_checkpoint(SEG_CFG, tmp_path / 'seg.pth')
    checkpoint = torch.load(ckpt, weights_only=True)
    dropped = [k for k in checkpoint['state_dict'] if k.endswith('num_batches_tracked')]
    assert dropped  # the toy segmentor has BatchNorm layers
    checkpoint['state_dict'] = {k: v for k, v in checkpoint['state_dict'].items()
                                if k not in dropped}
    torch.save(checkpoint, ckpt)
    proc = run_tool('test.py', SEG_CFG, ckpt, '--work-dir', tmp_path / 'w', *NO_WORKERS,
                    'test_dataloader.dataset.indices=2')
    assert 'strict load' in proc.stdout + proc.stderr and 'mIoU' in proc.stdout + proc.stderr
