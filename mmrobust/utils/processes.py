"""Child processes that do not outlive the process that made them.

A cluster job is killed (``SIGTERM``, then ``SIGKILL``) without its children being asked to stop.
A PyTorch dataloader worker then checks its parent only between batches: one blocked writing a
batch into its pipe (whose other end its siblings still hold) never gets there and lives on,
holding whatever it inherited. :func:`children_die_with_parent` makes every child forked from then
on (dataloader workers, and their own children) watch its parent and exit when the parent is gone.
"""
import os
import select
import sys
import threading
import time

__all__ = ['PARENT_POLL_S', 'children_die_with_parent', 'exit_with_parent', 'exit_with_process',
           'name_this_process']

#: Seconds between two looks of a child at its parent.
PARENT_POLL_S = 0.5

_installed = False
_forking_pid = {'pid': 0}


def exit_with_parent(parent: int, poll_s: float = PARENT_POLL_S) -> threading.Thread:
    """Exit this process (status 1) once ``parent`` is no longer its parent.

    A daemon thread polls ``os.getppid()``: a dead parent's children are re-parented (to
    ``init`` or a subreaper). ``os._exit`` ends the process even when its main thread is blocked
    in a system call (a pipe write), which a signal handler could not.

    Args:
        parent: the pid of the parent to follow.
        poll_s: seconds between two looks.

    Returns:
        The watching thread (started).
    """
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)
    thread = threading.Thread(target=watch, name='mmrobust-parent-watch', daemon=True)
    thread.start()
    return thread


def exit_with_process(pid: int, poll_s: float = PARENT_POLL_S) -> threading.Thread:
    """Exit this process (status 1) once the process ``pid`` has ended, parent or not.

    For a child started by a fork server, whose parent is the server, not the process that asked
    for it. On Linux a pidfd (readable the moment ``pid`` exits, no reused-pid confusion once
    opened); elsewhere ``os.kill(pid, 0)`` every ``poll_s`` seconds. ``pid`` already gone: exits
    now.

    Returns:
        The watching thread (started).
    """
    try:
        handle = os.pidfd_open(pid)  # type: ignore[attr-defined]
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):  # NOTE: not Linux, or a kernel before 5.3
        handle = None

    def watch() -> None:
        if handle is not None:
            select.select([handle], [], [])
            os._exit(1)
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:  # NOTE: alive, another user's (a reused pid cannot be ours)
                pass
            time.sleep(poll_s)
    thread = threading.Thread(target=watch, name='mmrobust-process-watch', daemon=True)
    thread.start()
    return thread


def name_this_process(name: str) -> None:
    """The name ``ps``, ``top`` and ``/proc/<pid>/comm`` show for this process (Linux; 15 bytes).

    A forked child shows its parent's command line; the name tells the processes apart.
    Elsewhere a no-op: only a label.
    """
    if not sys.platform.startswith('linux'):
        return
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):  # NOTE: only a label; the process works without it
        pass


def _before_fork() -> None:
    _forking_pid['pid'] = os.getpid()


def _after_fork_in_child() -> None:
    # NOTE: the pid recorded before the fork, not getppid() now: the parent may already be gone
    exit_with_parent(_forking_pid['pid'])


def children_die_with_parent() -> None:
    """From now on, every child this process forks exits when this process is gone.

    Idempotent. Children forked by those children inherit the rule (fork copies the hooks).
    ``spawn`` / ``forkserver`` children are not forked by this process: they watch their parent
    themselves (:func:`exit_with_parent`).
    """
    global _installed
    if not _installed:
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
        _installed = True
