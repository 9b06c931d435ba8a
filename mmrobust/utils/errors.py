"""The errors a user's input causes, and how the tools report them.

Every error the project raises for something the user gave it (an unknown name, a bad value, a
missing file, a checkpoint of another architecture, a results file held by another run, a
refused conversion) derives from :class:`MMRobustError`. Its message says what was wrong and
how to fix it, so the tools (through :func:`run_tool`) print it as one ``error: <message>``
line on stderr and exit with its ``exit_code``: 2 for a usage error (:class:`UsageError`: a
name or value on the command line or in the config), 1 for refused input (a file that is
missing, malformed, locked or of the wrong kind). Any other exception is a bug in mmrobust (or
below it) and keeps its full traceback; ``--debug`` or ``MMROBUST_DEBUG=1`` shows the traceback
of a user error as well.

The classes keep the builtin type they replace (``UsageError`` is a ``ValueError``,
``InputNotFoundError`` a ``FileNotFoundError``), so code that catches those still does.
"""
import errno
import os
import re
import sys
import traceback
from typing import Callable, NoReturn, Optional

__all__ = ['MMRobustError', 'UsageError', 'UnknownNameError', 'ConfigError', 'InputNotFoundError',
           'FILE_SYSTEM_ERRNOS', 'file_system_error', 'user_error', 'run_tool', 'shareable',
           'DEBUG_ENV']

DEBUG_ENV = 'MMROBUST_DEBUG'

#: What the file system, not the code, refuses: a full disk or quota, a read-only or
#: unwritable folder, a file where a folder is (or the reverse). A tool ends on one of them with
#: an ``error:`` line (:func:`run_tool`), not a traceback.
FILE_SYSTEM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS,
                                errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR})


class MMRobustError(Exception):
    """Refused input: the message says what was wrong and what to do (exit status 1)."""

    exit_code = 1

    def __str__(self) -> str:
        # NOTE: one message argument prints as itself (a KeyError subclass would quote it)
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class UsageError(MMRobustError, ValueError):
    """A name or value the user chose (on the command line or in a config) is not valid.

    Exit status 2, as argparse's own usage errors.
    """

    exit_code = 2


class UnknownNameError(UsageError, KeyError):
    """A name (an arch, a corruption, a family...) that is not one of the known ones.

    The message lists them (exit status 2).
    """


class ConfigError(UsageError, RuntimeError):
    """A config lacks what a module or a command-line option needs (exit status 2)."""


class InputNotFoundError(MMRobustError, FileNotFoundError):
    """A file or folder the user named does not exist (exit status 1)."""


# what a DataLoader worker's re-raised exception carries: the worker's traceback in the message
_WORKER_TRACEBACK = re.compile(r'Original Traceback \(most recent call last\):.*', re.S)


def user_error(exc: BaseException) -> Optional[MMRobustError]:
    """The user error ``exc`` is or was raised from (``raise ... from``), if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, MMRobustError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__
    return None


def file_system_error(exc: BaseException) -> Optional[OSError]:
    """The file-system fault (:data:`FILE_SYSTEM_ERRNOS`) ``exc`` is or was raised from."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno in FILE_SYSTEM_ERRNOS:
            return exc
        seen.add(id(exc))
        exc = exc.__cause__  # NOTE: not __context__: a bug met while handling one is a bug
    return None


def _file_system_message(err: OSError, hint: str) -> str:
    where = os.fspath(err.filename) if err.filename is not None else 'a file'
    name = errno.errorcode.get(err.errno or 0, str(err.errno))
    return f'{where}: {err.strerror or os.strerror(err.errno or 0)} ({name}). {hint}'


def _message(err: MMRobustError) -> str:
    text = str(err)
    match = _WORKER_TRACEBACK.search(text)
    if match:  # NOTE: re-raised by a DataLoader worker: its last line is the message
        last = match.group(0).strip().splitlines()[-1]
        text = last.split(': ', 1)[1] if ': ' in last else last
    return text.strip()


def _rank() -> int:
    """This process's rank: torch.distributed's once initialised, else the launcher's."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:
        pass
    for var in ('RANK', 'SLURM_PROCID'):
        if os.environ.get(var, '').isdigit():
            return int(os.environ[var])
    return 0


def _debug_requested() -> bool:
    """Whether the tool runs in debug mode (tracebacks shown).

    ``--debug`` among the arguments (removed, so that the tool's parser never sees it) or
    ``MMROBUST_DEBUG`` set to anything but '' / '0'.
    """
    debug = '--debug' in sys.argv[1:]
    if debug:
        sys.argv[1:] = [a for a in sys.argv[1:] if a != '--debug']
    return debug or os.environ.get(DEBUG_ENV, '') not in ('', '0')


def run_tool(main: Callable[[], Optional[int]],
             file_error_hint: str = 'Free space or fix the permissions, and rerun the command.'
             ) -> NoReturn:
    """Run a tool's ``main`` and exit with its status.

    A user error (:class:`MMRobustError`) ends as one ``error: <message>`` line on stderr (rank 0
    only in a distributed run; every rank exits with the error's status), without a traceback unless
    debugging was asked for; so does a file-system fault (:data:`FILE_SYSTEM_ERRNOS`: the path,
    what the system said, ``file_error_hint``; status 1), once ``main`` has unwound (its locks
    released, its workers stopped). Anything else propagates with its traceback.
    """
    debug = _debug_requested()
    try:
        status = main()
    except Exception as exc:
        err = user_error(exc)
        fault = file_system_error(exc) if err is None else None
        if err is None and fault is None:
            raise
        if debug:
            traceback.print_exc()
        if _rank() == 0:
            text = _message(err) if err is not None else \
                _file_system_message(fault, file_error_hint)
            print(f'error: {text}', file=sys.stderr, flush=True)
            if not debug:
                print(f'(add --debug or set {DEBUG_ENV}=1 for the traceback)', file=sys.stderr,
                      flush=True)
        sys.exit(err.exit_code if err is not None else 1)
    sys.exit(status or 0)


def shareable(err: BaseException) -> BaseException:
    """``err`` if it pickles (it crosses to other ranks or processes).

    Otherwise a RuntimeError with its message: an error must stop the receiver either way.
    """
    import pickle
    try:
        pickle.dumps(err)
        return err
    except Exception:
        return RuntimeError(f'{type(err).__name__}: {err}')
