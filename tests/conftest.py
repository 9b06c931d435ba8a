"""Shared fixtures (the repository root, the toy datasets, a runner for the CLI tools) and the
suite's harness: per-test time limits and the check that no test leaves a process behind."""
import contextlib
import ctypes
import datetime
import faulthandler
import fcntl
import gc
import io
import multiprocessing
import os
import pickle
import runpy
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple
from unittest import mock

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / 'configs'
# model configs (mmdet / mmseg) and tokenizer-training configs (VQTokenizerTrainer)
TOKENIZER_CONFIGS = sorted((CONFIGS / 'tokenizers').glob('*.py'))
ALL_CONFIGS = sorted(p for p in CONFIGS.rglob('*.py')
                     if '_base_' not in p.parts and p not in TOKENIZER_CONFIGS)


# pytest-xdist: each worker's share of the cores, for torch in the worker and the tools it runs
# (more threads than cores, and torch runs every worker slower)
if os.environ.get('PYTEST_XDIST_WORKER_COUNT') and 'OMP_NUM_THREADS' not in os.environ:
    os.environ['OMP_NUM_THREADS'] = str(max(
        1, len(os.sched_getaffinity(0)) // int(os.environ['PYTEST_XDIST_WORKER_COUNT'])))

# the README demo's detector (tools/demo_toy.sh), trained once per session by `trained_toy_detector`
DEMO_DET_CFG = 'configs/toy/mask-rcnn_fan-t-hybrid_fpn_toy-coco.py'


def config_id(path: Path) -> str:
    return str(path.relative_to(CONFIGS))


@pytest.fixture(scope='session')
def toy_data() -> Dict[str, Path]:
    """The toy datasets under the repository's data/ folder, generated once (idempotent)."""
    from mmrobust.datasets import generate_toy_dataset
    roots = {}
    (REPO / 'data').mkdir(exist_ok=True)
    # NOTE: pytest-xdist workers share the folder: one generates, the others wait and skip
    with open(REPO / 'data' / '.toy_data.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in ('toy_coco', 'toy_cityscapes', 'toy_acdc', 'toy_foggy_cityscapes',
                     'toy_dark_zurich', 'toy_coco_o'):
            roots[name] = REPO / 'data' / name
            generate_toy_dataset(name, str(roots[name]), seed=0)
    return roots


@pytest.fixture
def in_repo(monkeypatch) -> Path:
    """Run the test from the repository root, where configs resolve `data/...`."""
    monkeypatch.chdir(REPO)
    return REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]



def _rank_entry(fn: Callable, rank: int, world: int, port: int, args: tuple, queue,
                timeout_s: float = 60) -> None:
    import torch.distributed as dist
    try:
        dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
        try:
            # NOTE: plain pickle: a queue shares tensors by file descriptor with a process
            # that may have exited by the time they are read
            queue.put((rank, None, pickle.dumps(fn(rank, world, *args))))
        finally:
            dist.destroy_process_group()
    except BaseException:
        queue.put((rank, traceback.format_exc(), None))


def run_ranks(fn: Callable, *args: Any, world: int = 2, limit: float = 180,
              group_timeout_s: float = 60) -> List[Any]:
    """``[fn(rank, world, *args) for each rank]``, run in ``world`` spawned processes joined in a
    gloo group whose collectives time out after ``group_timeout_s`` (``fn`` a module-level
    function, its results picklable); a rank's exception fails the test with its traceback."""
    context = multiprocessing.get_context('spawn')
    queue = context.Queue()
    port = free_port()
    procs = [context.Process(target=_rank_entry,
                             args=(fn, r, world, port, args, queue, group_timeout_s))
             for r in range(world)]
    for p in procs:
        p.start()
    results: Dict[int, Any] = {}
    try:
        for _ in range(world):
            rank, error, result = queue.get(timeout=limit)
            if error is not None:
                raise AssertionError(f'rank {rank} of {world} failed:\n{error}')
            results[rank] = pickle.loads(result)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world)]

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
    return run_cmd([sys.executable, REPO / 'tools' / tool, *args], **kwargs)


def run_tool_in_process(tool: str, *args) -> Tuple[int, str, str]:
    """tools/TOOL run in this process as its own ``__main__`` (a subprocess would spend seconds
    importing mmdet; the tools' start-up is tested in test_tools.py), without MMROBUST_DEBUG:
    (exit status, stdout, stderr). An exception the tool lets through propagates, and what the
    tool printed before it goes to the real streams (capsys reads it)."""
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


def assert_user_error(status: int, stderr: str, code: int, *texts: str) -> str:
    """A user error as the tools report it (mmrobust.utils.errors.run_tool): exit status
    ``code``, one ``error:`` line, the message from it on holding each of ``texts`` (a key
    list may go on over more lines), no traceback. The message is returned."""
    lines = [line for line in stderr.splitlines() if line.startswith('error: ')]
    assert status == code, f'exit status {status}, not {code}; stderr:\n{stderr[-3000:]}'
    assert len(lines) == 1, f'not one error: line in stderr:\n{stderr[-3000:]}'
    assert 'Traceback' not in stderr, stderr[-3000:]
    message = stderr[stderr.index(lines[0]):]
    assert all(t in message for t in texts), f'{texts} not all in {message!r}'
    return message


@pytest.fixture(scope='session')
def trained_toy_detector(toy_data, tmp_path_factory) -> Path:
    """The README demo's run: the toy FAN-T-Hybrid Mask R-CNN trained 300 iterations from
    scratch (~4 min, once).

    Returns its work dir (``iter_300.pth``, logs). Shared by the demo-learns test and the
    robustness-evaluation tests, which need a model that actually detects something.
    """
    _STARTED.add('trained_toy_detector')  # whatever happens next, the next user does not train
    work = tmp_path_factory.mktemp('demo') / 'learn'
    # NOTE: 250-410 s on the 2-core machines measured; the limit allows a machine ~6x slower
    run_tool('train.py', DEMO_DET_CFG, '--work-dir', work,
             '--cfg-options', 'train_dataloader.num_workers=0',
             'train_dataloader.persistent_workers=False', 'val_dataloader.num_workers=0',
             'val_dataloader.persistent_workers=False', timeout=2400)
    return work


def pytest_itemcollected(item) -> None:
    """A test that needs the trained demo detector is an end-to-end test: the `slow` tier; its
    tests run in one pytest-xdist worker (`--dist loadgroup`), which trains the detector once."""
    # NOTE: here rather than in pytest_collection_modifyitems, where pytest-xdist may read the
    # group before this conftest adds it
    if 'trained_toy_detector' in getattr(item, 'fixturenames', ()):
        item.add_marker(pytest.mark.slow)
        item.add_marker(pytest.mark.xdist_group('trained_toy_detector'))


# -- time limits ----------------------------------------------------------------------------------
# pytest-timeout's limit is `timeout` in pyproject.toml (300 s) for every test, except the ones
# set here, the only place that raises it. When a limit runs out the stacks of every thread are
# printed and the test fails (pytest-timeout's signal method); the session goes on.
# NOTE: the slow tests took up to ~100 s here (`--durations`); each tool run in them has its own
# 600 s net (`run_cmd`), so a slow test gets a little more than one such net.
SLOW_LIMIT = 900
# The test that trains the demo detector (the first user of `trained_toy_detector` in a process):
# the fixture's own 2400 s subprocess limit and the test itself.
TRAINING_FIXTURE_LIMIT = 2700
# A test stuck in C code (a collective, a lock taken without a timeout) never returns to Python,
# where the signal is handled: this long after its limit a watchdog thread prints every stack and
# ends the process (pytest-xdist reports the crashed test and starts a new worker).
WATCHDOG_GRACE = float(os.environ.get('MMROBUST_WATCHDOG_GRACE_S', 60))
_STARTED: set = set()  # session fixtures that have been built (or failed to) in this process


def time_limit(item: pytest.Item) -> Optional[float]:
    """The limit `item` gets here, or None for pytest-timeout's default (a marker wins)."""
    if item.get_closest_marker('timeout') is not None:
        return None
    if ('trained_toy_detector' in getattr(item, 'fixturenames', ())
            and 'trained_toy_detector' not in _STARTED):
        return TRAINING_FIXTURE_LIMIT
    if item.get_closest_marker('slow') is not None:
        return SLOW_LIMIT
    return None


def effective_limit(item: pytest.Item) -> float:
    """The limit pytest-timeout applies to `item` (its marker, else the configured default)."""
    marker = item.get_closest_marker('timeout')
    if marker is not None:
        return float(marker.args[0] if marker.args else marker.kwargs['timeout'])
    return float(item.config.getoption('timeout') or item.config.getini('timeout') or 0)


def _watchdog(item: pytest.Item, after: float) -> None:
    capman = item.config.pluginmanager.getplugin('capturemanager')
    if capman is not None:
        capman.suspend_global_capture(in_=True)
    sys.stderr.write(f'\n{"+" * 30} {item.nodeid}: still running {after:.0f} s after its start '
                     f'(stuck outside Python, where the time limit cannot stop it); the stacks '
                     f'of every thread, then this test process ends {"+" * 30}\n')
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(3)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Set the test's limit before pytest-timeout's wrapper reads it; arm the watchdog."""
    limit = time_limit(item)
    if limit is not None:
        item.add_marker(pytest.mark.timeout(limit))
    total = effective_limit(item)
    watchdog = None
    if total > 0:
        watchdog = threading.Timer(total + WATCHDOG_GRACE, _watchdog,
                                   (item, total + WATCHDOG_GRACE))
        watchdog.name = f'mmrobust watchdog {item.nodeid}'
        watchdog.daemon = True
        watchdog.start()
    try:
        yield
    finally:
        if watchdog is not None:
            watchdog.cancel()


# -- no process left behind -----------------------------------------------------------------------
# Orphans (a grandchild whose parent was killed, the worker of a pool whose owner died) are
# re-parented to this process rather than to init (Linux), so that the check below sees them.
_PR_SET_CHILD_SUBREAPER = 36
if sys.platform.startswith('linux'):
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # NOTE: without it the check still sees direct children
        pass


# helpers that multiprocessing starts once per interpreter and keeps by design (not a leak)
_PROCESS_SINGLETONS = ('multiprocessing.resource_tracker', 'multiprocessing.forkserver')


def descendants(pid: int) -> Dict[int, str]:
    """The live (not zombie) descendants of `pid`: pid -> command line, read from /proc."""
    if not os.path.isdir('/proc'):
        return {}
    children: Dict[int, list] = {}
    states: Dict[int, str] = {}
    for entry in os.scandir('/proc'):
        if not entry.name.isdigit():
            continue
        try:
            with open(f'/proc/{entry.name}/stat', 'rb') as f:
                stat = f.read()
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rindex(b')') + 2:].split()  # the name in (...) may hold spaces
        states[int(entry.name)] = fields[0].decode()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = {}, list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        todo.extend(children.get(child, ()))
        if states.get(child) in ('Z', 'X'):
            continue
        try:
            with open(f'/proc/{child}/cmdline', 'rb') as f:
                cmd = f.read().replace(b'\0', b' ').decode(errors='replace').strip()
        except OSError:
            continue
        found[child] = cmd or f'[pid {child}]'
    return found


def _reap(pids) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child (a grandchild): its parent reaps it
            pass


@pytest.fixture(autouse=True)
def no_leftover_processes(request):
    """Fail a test that leaves a process running (its own, a pool's, an orphaned one), naming
    them; they are killed, so that the next test starts clean."""
    def new_processes() -> Dict[int, str]:
        return {p: c for p, c in descendants(os.getpid()).items()
                if p not in before and not any(s in c for s in _PROCESS_SINGLETONS)}

    before = set(descendants(os.getpid()))
    yield
    left = new_processes()
    if not left:
        return
    gc.collect()  # NOTE: a pool or a dataloader that is only unreferenced ends its workers here
    # processes asked to stop may take a moment
    deadline = time.monotonic() + float(os.environ.get('MMROBUST_LEFTOVER_GRACE_S', 10))
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = new_processes()
    if not left:
        return
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.2)
    _reap(left)
    listing = '\n'.join(f'  pid {p}: {c[:300]}' for p, c in sorted(left.items()))
    pytest.fail(f'{request.node.nodeid} left {len(left)} process(es) running (killed now); '
                f'end what the test starts (join the pool, wait for the process, close the '
                f'dataloader) also when it fails:\n{listing}', pytrace=False)
