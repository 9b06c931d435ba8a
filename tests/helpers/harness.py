"""The suite's harness, a pytest plugin (``pytest_plugins`` in ``tests/conftest.py``).

Per-test time limits set in one place, a watchdog for a test stuck outside Python, and the check
that no test leaves a process behind.
"""
import ctypes
import faulthandler
import gc
import os
import signal
import sys
import threading
import time
from typing import Dict, Optional, Tuple

import pytest

# pytest-xdist: each worker's share of the cores, for torch in the worker and the tools it runs
# (more threads than cores, and torch runs every worker slower)
if os.environ.get('PYTEST_XDIST_WORKER_COUNT') and 'OMP_NUM_THREADS' not in os.environ:
    os.environ['OMP_NUM_THREADS'] = str(max(
        1, len(os.sched_getaffinity(0)) // int(os.environ['PYTEST_XDIST_WORKER_COUNT'])))


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
#: session fixtures that have been built (or failed to) in this process
STARTED: set = set()


def time_limit(item: pytest.Item) -> Optional[float]:
    """The limit ``item`` gets here, or None for pytest-timeout's default (a marker wins)."""
    if item.get_closest_marker('timeout') is not None:
        return None
    if ('trained_toy_detector' in getattr(item, 'fixturenames', ())
            and 'trained_toy_detector' not in STARTED):
        return TRAINING_FIXTURE_LIMIT
    if item.get_closest_marker('slow') is not None:
        return SLOW_LIMIT
    return None


def effective_limit(item: pytest.Item) -> float:
    """The limit pytest-timeout applies to ``item`` (its marker, else the configured default)."""
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


def _process_table() -> Tuple[Dict[int, list], Dict[int, str], Dict[int, int]]:
    """Every process's children, state and parent, read from /proc."""
    children: Dict[int, list] = {}
    states: Dict[int, str] = {}
    parents: Dict[int, int] = {}
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
        parents[int(entry.name)] = int(fields[1])
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children, states, parents


def descendants(pid: int, singletons: bool = True) -> Dict[int, str]:
    """The live (not zombie) descendants of ``pid``: pid -> ``[name] command line``, from /proc.

    The name (``/proc/<pid>/comm``) tells apart what a fork server forked: they show the
    server's command line. ``singletons=False`` leaves out the helpers multiprocessing keeps
    (its resource tracker and fork server, not what the server forked).
    """
    if not os.path.isdir('/proc'):
        return {}
    children, states, parents = _process_table()
    found, todo = {}, list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        todo.extend(children.get(child, ()))
        if states.get(child) in ('Z', 'X'):
            continue
        try:
            with open(f'/proc/{child}/cmdline', 'rb') as f:
                cmd = f.read().replace(b'\0', b' ').decode(errors='replace').strip()
            with open(f'/proc/{child}/comm', 'rb') as f:
                name = f.read().decode(errors='replace').strip()
        except OSError:
            continue
        found[child] = f'[{name}] {cmd or f"[pid {child}]"}'
    if not singletons:
        found = {p: c for p, c in found.items() if not _singleton(c, found.get(parents.get(p)))}
    return found


def _singleton(cmd: str, parent_cmd: Optional[str]) -> bool:
    """A helper multiprocessing keeps by design, not a child its fork server forked.

    A forked child shows the same command line as its parent.
    """
    marker = next((s for s in _PROCESS_SINGLETONS if s in cmd), None)
    return marker is not None and not (parent_cmd and marker in parent_cmd)


def _reap(pids) -> None:
    """Collect the exit status of those of ``pids`` that are this process's children."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child (a grandchild): its parent reaps it
            pass


@pytest.fixture(autouse=True)
def no_leftover_processes(request):
    """Fail a test that leaves a process running (its own, a pool's, an orphaned one), naming them.

    They are killed, so that the next test starts clean.
    """
    def new_processes() -> Dict[int, str]:
        return {p: c for p, c in descendants(os.getpid(), singletons=False).items()
                if p not in before}

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
