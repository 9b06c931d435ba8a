"""Running the command-line tools from the tests.

In a subprocess (with the output shown on a failure and a safety-net time limit) or in the test's
own process, and what a user error looks like.
"""
import contextlib
import hashlib
import io
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Tuple
from unittest import mock

import pytest

from .paths import REPO
from .shared import build_once


def run_cmd(args, timeout: float = 600, env: Optional[Dict[str, str]] = None,
            check: bool = True) -> subprocess.CompletedProcess:
    """Run a command from the repository root; on failure show its output.

    ``timeout`` is a safety net (default: 10x or more what the tools' test runs take here);
    running past it fails the test with TIMEOUT, never with an assertion about results.
    """
    # NOTE: the 2-process launchers get one thread per process (torchrun's own default): two
    # processes of two threads each on two cores made the distributed tests ~2x slower
    multi = any(str(a).endswith(('dist_train.sh', 'dist_test.sh')) for a in args)
    threads = '1' if multi else os.environ.get('OMP_NUM_THREADS', '2')
    full_env = {**os.environ, 'PYTHONPATH': str(REPO), 'PYTHON': sys.executable,
                'OMP_NUM_THREADS': threads, **(env or {})}
    try:
        proc = subprocess.run([str(a) for a in args], cwd=REPO, env=full_env, timeout=timeout,
                              capture_output=True, text=True)
    except subprocess.TimeoutExpired as err:
        # NOTE: a safety net, not a speed test: say so, so that nobody reads it as a wrong result
        def tail(x):
            return (x.decode(errors='replace') if isinstance(x, bytes) else x or '')[-4000:]
        pytest.fail(f'TIMEOUT (not a wrong result): {" ".join(map(str, args))} was still running '
                    f'after {timeout:.0f} s, the safety limit for this command; the machine is '
                    f'probably overloaded or much slower than the ones the limit was sized for.\n'
                    f'--- stdout so far ---\n{tail(err.stdout)}\n--- stderr so far ---\n'
                    f'{tail(err.stderr)}')
    if check and proc.returncode != 0:
        pytest.fail(f'command failed ({proc.returncode}): {" ".join(map(str, args))}\n'
                    f'--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}')
    return proc


def run_tool(tool: str, *args, **kwargs) -> subprocess.CompletedProcess:
    """``tools/TOOL ARGS`` with this interpreter, through :func:`run_cmd` (same keywords)."""
    return run_cmd([sys.executable, REPO / 'tools' / tool, *args], **kwargs)


def run_tool_in_process(tool: str, *args) -> Tuple[int, str, str]:
    """tools/TOOL run in this process as its own ``__main__``.

    A subprocess would spend seconds importing mmdet; the tools' start-up is tested in
    test_tools.py. Without MMROBUST_DEBUG: (exit status, stdout, stderr). An exception the tool lets
    through propagates, and what the tool printed before it goes to the real streams (capsys reads
    it).
    """
    out, err = io.StringIO(), io.StringIO()
    env = {k: v for k, v in os.environ.items() if k != 'MMROBUST_DEBUG'}
    try:
        with mock.patch.object(sys, 'argv', [tool, *map(str, args)]), \
                mock.patch.dict(os.environ, env, clear=True), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                pytest.raises(SystemExit) as exit_:
            runpy.run_path(str(REPO / 'tools' / tool), run_name='__main__')
    except BaseException:
        sys.stdout.write(out.getvalue())
        sys.stderr.write(err.getvalue())
        raise
    return exit_.value.code, out.getvalue(), err.getvalue()


def _manager_classes() -> list:
    from mmengine.utils import ManagerMixin
    found, todo = [], [ManagerMixin]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [cls for cls in found if '_instance_dict' in vars(cls)]


@contextlib.contextmanager
def _fresh_global_instances():
    """mmengine's global instances (visualizer, logger, message hub, scope) as a new process has.

    mmengine returns an existing instance of the same name: a second run in one process would
    write its scalars into the first run's visualizer, hence into the first run's folder. The
    test's own instances are back afterwards.
    """
    saved = {cls: cls._instance_dict for cls in _manager_classes()}
    for cls in saved:
        cls._instance_dict = type(saved[cls])()
    try:
        yield
    finally:
        for cls, instances in saved.items():
            cls._instance_dict = instances


def run_tool_here(tool: str, *args, env: Optional[Dict[str, str]] = None,
                  check: bool = True) -> subprocess.CompletedProcess:
    """``tools/TOOL ARGS`` in this process, with :func:`run_tool`'s result and keywords.

    For end-to-end tests that run tools several times: each subprocess spends seconds importing
    torch, mmdet and mmseg (``tools/analysis_tools/suite_durations.py`` shows where the suite's
    time goes). From the repository root, ``env`` over this process's environment, the exit status,
    stdout and stderr as a ``CompletedProcess``; with ``check`` a non-zero status fails the test
    with the output. Tests of the process itself (signals, kills, launchers, start-up, imports of a
    user's module) keep :func:`run_tool`.
    """
    cwd = os.getcwd()
    try:
        os.chdir(REPO)
        with mock.patch.dict(os.environ, env or {}), _fresh_global_instances():
            status, out, err = run_tool_in_process(tool, *args)
    finally:
        os.chdir(cwd)
    if isinstance(status, str):  # NOTE: SystemExit(message): Python prints it, exit status 1
        err, status = f'{err}{status}\n', 1
    status = status or 0
    if check and status != 0:
        pytest.fail(f'command failed ({status}): {tool} {" ".join(map(str, args))}\n'
                    f'--- stdout ---\n{out[-6000:]}\n--- stderr ---\n{err[-6000:]}')
    return subprocess.CompletedProcess([tool, *map(str, args)], status, out, err)


def assert_user_error(status: int, stderr: str, code: int, *texts: str) -> str:
    """A user error as the tools report it (mmrobust.utils.errors.run_tool).

    Exit status ``code``, one ``error:`` line, the message from it on holding each of ``texts`` (a
    key list may go on over more lines), no traceback. The message is returned.
    """
    lines = [line for line in stderr.splitlines() if line.startswith('error: ')]
    assert status == code, f'exit status {status}, not {code}; stderr:\n{stderr[-3000:]}'
    assert len(lines) == 1, f'not one error: line in stderr:\n{stderr[-3000:]}'
    assert 'Traceback' not in stderr, stderr[-3000:]
    message = stderr[stderr.index(lines[0]):]
    assert all(t in message for t in texts), f'{texts} not all in {message!r}'
    return message


def robustness_runner(config: str, work_dir: str, checkpoint: Optional[str] = None,
                options: Optional[Dict] = None):
    """A runner of a repository config for ``evaluate_robustness``: its test set, checkpoint loaded.

    ``options``: ``--cfg-options`` as a dict. Returns ``(runner, cfg)``.
    """
    from mmengine.config import Config

    from mmrobust.apis import apply_common_args, apply_test_args, build_runner
    cfg = Config.fromfile(str(REPO / config))
    cfg = apply_common_args(cfg, str(REPO / config), 'none', work_dir, options)
    if checkpoint is not None:
        cfg = apply_test_args(cfg, checkpoint)
    runner = build_runner(cfg, ('test_dataloader', ))
    runner.call_hook('before_run')
    if checkpoint is not None:
        runner.load_or_resume()
    return runner, cfg


def _build_init_checkpoint(config: str, path: Path) -> None:
    import torch
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    import mmrobust  # noqa: F401
    cfg = Config.fromfile(str(REPO / config))
    init_default_scope(cfg.default_scope)
    registry = __import__(f'{cfg.default_scope}.registry', fromlist=['MODELS'])
    torch.manual_seed(0)
    model = registry.MODELS.build(cfg.model)
    model.init_weights()
    with open(path, 'wb') as f:
        torch.save({'state_dict': model.state_dict(), 'meta': {}}, f)


def init_checkpoint(config: str, path) -> Path:
    """A checkpoint of a repository config's freshly initialised model (seeded; no training).

    Built once per run for every worker (:func:`~.shared.build_once`; the same seed gives the
    same weights) and copied to ``path``, which the test may change.
    """
    key = hashlib.sha256(str((REPO / config).resolve()).encode()).hexdigest()[:16]
    built = build_once(f'init-{Path(config).stem}-{key}.pth',
                       lambda part: _build_init_checkpoint(config, part))
    shutil.copyfile(built, path)
    return Path(path)
