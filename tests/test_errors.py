"""A user's mistake reads as a message, not as a crash.

mmrobust.utils.errors.run_tool, the entry point of every tool, prints a user error as one ``error:``
line and exits 2 (usage) or 1 (refused input); a bug keeps its traceback; ``--debug`` /
MMROBUST_DEBUG show it for both.

Each tool's own cases run in-process here (the tool's module as ``__main__``: no start-up per
case); test_strict_load (a checkpoint of another architecture, four tools), test_robustness (a
locked results file, an unknown corruption), test_make_corrupted and test_tools (a missing source
folder, dataset or checkpoint) check the same through real processes.
"""
import glob
import sys
from pathlib import Path

import pytest

from mmrobust.corruptions import UnknownCorruptionError
from mmrobust.evaluation.attacks import AttackError, AttackLossError
from mmrobust.evaluation.metric_worker import MetricWorkerError
from mmrobust.evaluation.shards import ShardSpecError
from mmrobust.models.checkpoint import CheckpointMismatchError
from mmrobust.utils import FileLockedError, RegistryLookupError
from mmrobust.utils.errors import (
    ConfigError,
    InputNotFoundError,
    MMRobustError,
    UsageError,
    run_tool,
)

from helpers import REPO, assert_user_error, run_cmd, run_tool_in_process


def _run(main, capsys, argv=('tool', )):
    """run_tool(main) as a tool's __main__ does: (exit status, stderr)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, 'argv', list(argv))
        with pytest.raises(SystemExit) as exit_:
            run_tool(main)
    return exit_.value.code, capsys.readouterr().err


def _raise(exc):
    def main():
        raise exc
    return main


@pytest.mark.parametrize('exc, code', [
    (UsageError('--metric-queue must be 0 (serial) or more, got -1'), 2),
    (UnknownCorruptionError("Unknown corruption 'fogg'. Valid corruptions: fog"), 2),
    (ConfigError('--tta needs `tta_model` and `tta_pipeline` in the config'), 2),
    (RegistryLookupError("'Nope' is not registered in mmdet::model"), 2),
    (InputNotFoundError("checkpoint 'x.pth' does not exist"), 1),
    (CheckpointMismatchError('missing keys (2): a, b'), 1),
    (FileLockedError('r.json is being written by pid 7'), 1),
    (MetricWorkerError('the metric worker died while computing the metrics of cell fog 3 '
                       '(exit code -9); its predictions are kept in p.pkl. Rerun the same '
                       'command'), 1),
    (ShardSpecError("--shard takes I/N with 0 <= I < N, got '3/2'"), 2),
    (AttackError('epsilon must be a finite number >= 0, got -1'), 2),
    (AttackLossError('the training loss of MaskRCNN could not be computed from the test data'),
     1),
], ids=lambda x: type(x).__name__ if isinstance(x, Exception) else str(x))
def test_a_user_error_is_one_line_and_its_status(exc, code, capsys, monkeypatch):
    monkeypatch.delenv('MMROBUST_DEBUG', raising=False)
    status, err = _run(_raise(exc), capsys)
    message = assert_user_error(status, err, code, str(exc.args[0]))
    assert message.startswith(f'error: {exc.args[0]}\n')  # a KeyError's message is not quoted
    assert '--debug' in err  # says how to see more


def test_a_file_system_fault_is_one_line_with_the_path_and_the_tools_hint(capsys, monkeypatch):
    """A full disk, a read-only folder: the path, what the system said, what to do; not a bug.

    Raised from another error (``raise ... from``) too; a bug met while handling one keeps its
    traceback, and so does an ``OSError`` the file system did not cause.
    """
    import errno
    import os
    monkeypatch.delenv('MMROBUST_DEBUG', raising=False)
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), 'runs/r.json')
    status, err = _run(_raise(full), capsys)
    assert_user_error(status, err, 1, 'runs/r.json: No space left on device (ENOSPC). Free '
                      'space or fix the permissions, and rerun the command.')

    def wrapped():
        try:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), 'runs')
        except OSError as cause:
            raise RuntimeError('saving failed') from cause
    with pytest.raises(SystemExit) as exit_:
        run_tool(wrapped, file_error_hint='Rerun it to resume.')
    assert_user_error(exit_.value.code, capsys.readouterr().err, 1,
                      'runs: Read-only file system (EROFS). Rerun it to resume.')

    def bug_while_handling():
        try:
            raise OSError(errno.EACCES, 'Permission denied', 'x')
        except OSError:
            raise ZeroDivisionError('a bug')
    for bug in (bug_while_handling, _raise(OSError(errno.ECONNRESET, 'reset'))):
        with pytest.raises((ZeroDivisionError, ConnectionResetError)):
            _run(bug, capsys)
        assert 'error:' not in capsys.readouterr().err


def test_the_builtin_types_are_kept():
    """Code that caught the builtin types the errors replace still does."""
    assert issubclass(UnknownCorruptionError, KeyError)
    assert issubclass(InputNotFoundError, FileNotFoundError)
    assert issubclass(UsageError, ValueError) and issubclass(ConfigError, RuntimeError)
    assert issubclass(CheckpointMismatchError, RuntimeError)


def test_a_bug_keeps_its_traceback(capsys, monkeypatch):
    """Anything that is not a user error propagates (Python prints its traceback).

    Even a builtin type the user errors derive from.
    """
    monkeypatch.delenv('MMROBUST_DEBUG', raising=False)
    for bug in (ZeroDivisionError('division by zero'), ValueError('bad'), KeyError('k')):
        with pytest.raises(type(bug)):
            _run(_raise(bug), capsys)
        assert 'error:' not in capsys.readouterr().err


@pytest.mark.parametrize('how', ['--debug', 'MMROBUST_DEBUG=1'])
def test_debug_shows_the_traceback(how, capsys, monkeypatch):
    seen = []

    def main():
        seen.append(list(sys.argv))
        raise InputNotFoundError('source folder nope does not exist')
    argv = ['tool', 'a', '--debug', 'b'] if how == '--debug' else ['tool', 'a', 'b']
    monkeypatch.setenv('MMROBUST_DEBUG', '1' if how != '--debug' else '0')
    status, err = _run(main, capsys, argv)
    assert status == 1 and seen == [['tool', 'a', 'b']]  # the tool's parser never sees it
    assert 'Traceback (most recent call last)' in err and 'in main' in err
    assert err.rstrip().endswith('error: source folder nope does not exist')


def test_only_rank_0_prints_every_rank_exits_alike(capsys, monkeypatch):
    monkeypatch.delenv('MMROBUST_DEBUG', raising=False)
    for var in ('RANK', 'SLURM_PROCID'):
        monkeypatch.setenv(var, '3')
        assert _run(_raise(UsageError('bad value')), capsys) == (2, '')
        monkeypatch.delenv(var)
    monkeypatch.setenv('RANK', '0')
    status, err = _run(_raise(UsageError('bad value')), capsys)
    assert_user_error(status, err, 2, 'bad value')


def test_a_user_error_behind_a_wrapper_or_a_worker(capsys, monkeypatch):
    """Raised ``from`` a user error.

    Or re-raised by a DataLoader worker (whose message carries the worker's traceback): the message
    is the user error's own.
    """
    from torch._utils import ExceptionWrapper
    monkeypatch.delenv('MMROBUST_DEBUG', raising=False)

    def wrapped():
        try:
            raise InputNotFoundError('image a.png does not exist')
        except MMRobustError as err:
            raise RuntimeError('loading failed') from err
    status, err = _run(wrapped, capsys)
    assert_user_error(status, err, 1, 'error: image a.png does not exist')

    def from_worker():
        try:
            raise InputNotFoundError('image b.png does not exist')
        except MMRobustError:
            ExceptionWrapper(where='in DataLoader worker process 0').reraise()
    status, err = _run(from_worker, capsys)
    assert_user_error(status, err, 1)
    assert err.startswith('error: image b.png does not exist\n')


def _tool(tool: str, *args):
    """(exit status, stderr) of a tool run in-process."""
    status, _, err = run_tool_in_process(tool, *args)
    return status, err


def test_the_issue_cases_through_their_tools(toy_data, tmp_path):
    src = toy_data['toy_coco'] / 'val2017'
    status, err = _tool('make_corrupted.py', src, tmp_path / 'o', '--corruptions', 'fogg')
    assert_user_error(status, err, 2, "Unknown corruption 'fogg'", 'fog, brightness')
    status, err = _tool('make_corrupted.py', src, tmp_path / 'o', '--severities', '7')
    assert_user_error(status, err, 2, 'Severities must be in 1..5, got [7]')
    status, err = _tool('make_corrupted.py', tmp_path / 'nope', tmp_path / 'o')
    assert_user_error(status, err, 1, f'{tmp_path / "nope"} does not exist')
    status, err = _tool('test_robustness.py', 'configs/toy/mask-rcnn_r18_fpn_toy-coco.py',
                        tmp_path / 'x.pth', '--corruptions', 'fog')
    assert_user_error(status, err, 1, f"checkpoint '{tmp_path / 'x.pth'}' does not exist",
                      'bash tools/demo_toy.sh CONFIG')
    status, err = _tool('test_robustness.py', 'configs/toy/mask-rcnn_r18_fpn_toy-coco.py',
                        tmp_path / 'x.pth', '--epsilons', '0.01')
    assert_user_error(status, err, 2, '--epsilons needs --attacks')
    assert not (tmp_path / 'o').exists()


def test_an_internal_error_keeps_its_traceback(toy_data, tmp_path, capsys, monkeypatch):
    """A fault injected into a corruption is a bug, not the user's.

    It propagates (the traceback), no error: line.
    """
    import mmrobust.corruptions.generate as generate

    def faulty(*args, **kwargs):
        raise ZeroDivisionError('injected fault')
    monkeypatch.setattr(generate, 'corrupt', faulty)
    src = toy_data['toy_coco'] / 'val2017'
    capsys.readouterr()
    with pytest.raises(generate.CorruptionWriteError) as info:
        _tool('make_corrupted.py', src, tmp_path / 'o', '--corruptions', 'fog',
              '--severities', '1', '--workers', '1')
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert 'error:' not in capsys.readouterr().err


def test_a_real_process_shows_the_traceback_with_debug(tmp_path):
    """The installed entry point (``python -m mmrobust.corruptions``), as a user runs it.

    With --debug (test_make_corrupted runs tools/make_corrupted.py without it: no traceback).
    """
    cmd = [sys.executable, '-m', 'mmrobust.corruptions', tmp_path / 'nope', tmp_path / 'o']
    proc = run_cmd([*cmd, '--debug'], check=False, env={'MMROBUST_DEBUG': ''})
    assert proc.returncode == 1 and 'Traceback (most recent call last)' in proc.stderr
    assert 'InputNotFoundError: Source dataset folder' in proc.stderr


def test_every_tool_runs_through_the_wrapper():
    """Each tool's __main__ calls run_tool (or hands over to a tool that does)."""
    tools = sorted(glob.glob(str(REPO / 'tools' / '**' / '*.py'), recursive=True))
    assert len(tools) > 20
    for path in tools:
        text = Path(path).read_text()
        main = text.split("if __name__ == '__main__':", 1)
        assert len(main) == 2, f'{path} has no __main__ block'
        assert 'run_tool(' in main[1] or 'runpy.run_path' in main[1], \
            f'{path}: its __main__ block does not call mmrobust.utils.errors.run_tool'
    assert 'run_tool(main)' in (REPO / 'mmrobust' / 'corruptions' / '__main__.py').read_text()
