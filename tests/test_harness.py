"""The suite's own harness (the plugin tests/helpers/harness.py).

A hung test is reported with the stacks of every thread within its limit, the limits are the ones
set in one place, and a test that leaves a process running fails, naming it, and the process is
killed.

The misbehaving tests below run only inside a pytest of their own, started by the tests that
check what the harness makes of them (``MMROBUST_HARNESS_SELFTEST`` names the one to run).
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from helpers import REPO
from helpers.harness import (
    SLOW_LIMIT,
    TRAINING_FIXTURE_LIMIT,
    descendants,
    effective_limit,
    time_limit,
)

SELFTEST = os.environ.get('MMROBUST_HARNESS_SELFTEST', '')


def _only(name: str):
    return pytest.mark.skipif(SELFTEST != name, reason='a misbehaving test for the harness '
                              'tests; run in its own pytest with MMROBUST_HARNESS_SELFTEST='
                              f'{name}')


@_only('hang')
def test_sleeps_forever():
    threading.Thread(target=time.sleep, args=(10**6, ), name='helper-that-sleeps',
                     daemon=True).start()
    time.sleep(10**6)


@_only('stuck')
def test_stuck_where_the_limit_cannot_reach():
    # as a call into C that never returns to Python: the limit's signal is never handled here
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(10**6)


@_only('leak')
def test_leaves_a_process_running():
    subprocess.Popen(['sleep', '600'])


@_only('orphan')
def test_leaves_an_orphan_running():
    # the shell ends at once; its background child is re-parented (to the pytest process)
    subprocess.run(['sh', '-c', 'sleep 600 & exit 0'], check=True)


def _selftest(name: str, *pytest_args: str, timeout: float = 120,
              env: dict = None) -> subprocess.CompletedProcess:
    env = {**os.environ, 'MMROBUST_HARNESS_SELFTEST': name, 'PYTHONPATH': str(REPO),
           'MMROBUST_LEFTOVER_GRACE_S': '1', **(env or {})}
    return subprocess.run([sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', '-q',
                           '-p', 'no:xdist', *pytest_args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_hang_is_reported_with_the_stacks_of_every_thread():
    start = time.monotonic()
    proc = _selftest('hang', 'tests/test_harness.py::test_sleeps_forever', '--timeout', '3')
    took = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert 'Failed: Timeout (>3.0s) from pytest-timeout' in out, out
    assert 'FAILED tests/test_harness.py::test_sleeps_forever' in out, out
    # the other thread's stack and the test's own frame
    assert 'Stack of helper-that-sleeps' in out and 'time.sleep(10**6)' in out, out
    assert took < 60, f'the hang was reported after {took:.0f} s'


def test_a_test_stuck_outside_python_is_ended_by_the_watchdog_with_every_stack():
    start = time.monotonic()
    proc = _selftest('stuck', 'tests/test_harness.py::test_stuck_where_the_limit_cannot_reach',
                     '--timeout', '2', env={'MMROBUST_WATCHDOG_GRACE_S': '2'})
    took = time.monotonic() - start
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert ('tests/test_harness.py::test_stuck_where_the_limit_cannot_reach: still running 4 s '
            'after its start') in proc.stderr, proc.stderr
    assert 'in test_stuck_where_the_limit_cannot_reach' in proc.stderr  # the main thread's stack
    assert took < 60


@pytest.mark.parametrize('name,test', [('leak', 'test_leaves_a_process_running'),
                                       ('orphan', 'test_leaves_an_orphan_running')])
def test_a_process_left_running_fails_the_test_and_is_killed(name, test):
    before = set(descendants(os.getpid()))
    proc = _selftest(name, f'tests/test_harness.py::{test}')
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert f'ERROR tests/test_harness.py::{test}' in out, out
    assert 'left 1 process(es) running (killed now)' in out and 'sleep 600' in out, out
    # the pytest that ran it has ended and nothing of it is left (no `sleep 600` of ours)
    left = {p: c for p, c in descendants(os.getpid()).items() if p not in before}
    # (an orphan of the inner pytest would have come up to this process, a subreaper too)
    assert not left, left


def test_a_quick_test_gets_the_default_limit(request):
    assert time_limit(request.node) is None
    assert effective_limit(request.node) == float(request.config.getini('timeout')) == 300


@pytest.mark.slow
def test_a_slow_test_gets_the_slow_limit(request):
    assert effective_limit(request.node) == SLOW_LIMIT > 600  # above run_cmd's own net


class _Item:
    """What ``time_limit`` reads of a test item."""

    def __init__(self, fixturenames=(), markers=()):
        self.fixturenames = list(fixturenames)
        self._markers = {m: getattr(pytest.mark, m).mark for m in markers}

    def get_closest_marker(self, name):
        return self._markers.get(name)


def test_the_first_user_of_the_trained_detector_gets_the_training_limit(monkeypatch):
    from helpers import harness
    monkeypatch.setattr(harness, 'STARTED', set())
    user = _Item(['trained_toy_detector', 'tmp_path'], ['slow'])
    assert time_limit(user) == TRAINING_FIXTURE_LIMIT > 2400
    harness.STARTED.add('trained_toy_detector')
    assert time_limit(user) == SLOW_LIMIT
    assert time_limit(_Item(['tmp_path'])) is None
    assert time_limit(_Item(['tmp_path'], ['slow', 'timeout'])) is None  # its own marker wins


def test_the_suite_imports_helpers_not_conftest():
    """Tests import the package ``helpers``; conftest.py holds fixtures and registers the harness.

    The harness (time limits, watchdog, reaper) is the plugin ``helpers.harness``, mmengine's
    memoised config work the plugin ``helpers.config_memo``.
    """
    importing = re.compile(r'^\s*(from conftest import|import conftest\b)', re.M)
    offenders = [str(p.relative_to(REPO)) for p in sorted((REPO / 'tests').rglob('*.py'))
                 if importing.search(p.read_text())]
    assert not offenders, f'import from helpers instead of conftest: {offenders}'
    conftest = (REPO / 'tests' / 'conftest.py').read_text()
    assert "pytest_plugins = ('helpers.harness', 'helpers.config_memo')" in conftest
    assert 'def pytest_runtest_protocol' not in conftest and 'def descendants' not in conftest


def test_the_config_memo_gives_mmengines_own_text_and_paths(tmp_path):
    """helpers.config_memo: the formatted config and the ``pkg::`` paths mmengine gives, once."""
    from mmengine.config import Config

    from helpers import config_memo
    names = ['mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py',  # a metafile entry
             'mmdet::_base_/models/mask-rcnn_r50_fpn.py',  # a base file: ValueError inside
             'mmseg::segformer/segformer_mit-b0_8xb1-160k_cityscapes-1024x1024.py']
    config = REPO / 'configs' / 'toy' / 'mask-rcnn_fan-t-hybrid_fpn_toy-coco.py'
    was_on = config_memo.config_utils._get_cfg_metainfo is config_memo.cfg_metainfo
    config_memo.uninstall()
    try:
        paths = [Config._get_cfg_path(n, str(config)) for n in names]
        cfg = Config.fromfile(str(config))
        text = cfg.pretty_text
    finally:
        config_memo.install()
    assert [Config._get_cfg_path(n, str(config)) for n in names] == paths
    assert all(p.endswith(n.split('::')[1]) and s == n.split('::')[0] for (p, s), n in
               zip(paths, names))
    with pytest.raises(ValueError, match='_base_/nope.py'):
        config_memo.cfg_metainfo(paths[0][0].split('/.mim/')[0], '_base_/nope.py')
    memo = Config.fromfile(str(config))
    assert memo.to_dict() == cfg.to_dict()
    assert memo.pretty_text == text == memo.pretty_text
    hits = config_memo._format.cache_info().hits
    memo.dump(str(tmp_path / 'dumped.py'))  # a Runner's dump: the text formatted once already
    assert config_memo._format.cache_info().hits == hits + 1
    assert (tmp_path / 'dumped.py').read_text() == text
    if not was_on:  # NOTE: MMROBUST_CONFIG_MEMO=0: the rest of this process without it
        config_memo.uninstall()
