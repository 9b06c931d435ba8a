"""Writing files so that a crash never leaves half of one, and resumable results files.

Every file mmrobust writes for a user (results, manifests, checkpoints, figures, corrupted
images) goes through :func:`atomic_write`: the data goes to a temporary file next to the target,
is flushed to disk and renamed over it, so a reader sees the old file or the new one, never a
mix. Temporaries carry :data:`TMP_MARK` so a resumed job can find and remove those a killed run
left behind.
"""
import datetime
import json
import os
import os.path as osp
from contextlib import contextmanager
from typing import IO, Any, Dict, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from .errors import MMRobustError, UsageError

__all__ = ['TMP_MARK', 'atomic_write', 'atomic_json', 'atomic_bytes', 'atomic_image',
           'check_writable', 'save_figure', 'ResultsStore', 'ResultsMismatchError',
           'ResultsFileError', 'FileLockedError', 'exclusive_lock']

#: Marks the temporary files of :func:`atomic_write` (``<name>.mmrobust-tmp-<pid>``).
TMP_MARK = '.mmrobust-tmp-'

#: The descriptors of the locks this process holds (:func:`exclusive_lock`).
_HELD_LOCKS: set = set()


def _forget_locks_in_child() -> None:
    """In a forked child: close the descriptors of the parent's locks.

    An ``flock`` belongs to the open file description, which a fork shares: a child keeping the
    descriptor keeps the lock, so a dataloader worker that outlives a killed run (blocked writing
    to its pipe) would refuse every resume. Closing (never ``LOCK_UN``, which would release the
    parent's lock too) drops the child's share only.
    """
    for fd in list(_HELD_LOCKS):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_LOCKS.clear()


os.register_at_fork(after_in_child=_forget_locks_in_child)

PathLike = Union[str, 'os.PathLike[str]']


@contextmanager
def atomic_write(path: PathLike, mode: str = 'w', fsync: bool = True,
                 **open_kwargs: Any) -> Iterator[IO]:
    """Open ``path`` for writing through a temporary file that replaces it on success.

    On an exception the temporary file is removed and ``path`` keeps its previous content; a
    write the file system refuses (a full disk: ``write`` names no file) is raised naming
    ``path``. ``fsync=False`` skips the flush to disk for throw-away outputs (figures, previews).
    """
    if mode not in ('w', 'wb'):
        raise ValueError(f"atomic_write writes whole files: mode 'w' or 'wb', got {mode!r}")
    path = os.fspath(path)
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    tmp = f'{path}{TMP_MARK}{os.getpid()}'
    try:
        with open(tmp, mode, **open_kwargs) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if osp.exists(tmp):
            os.remove(tmp)
        if isinstance(err, OSError) and err.filename in (None, tmp):
            raise OSError(err.errno, err.strerror, path) from err
        raise


def check_writable(path: PathLike, option: str) -> None:
    """Stop now if ``path`` (a file a job will write, given as ``option``) cannot be written.

    Before any long work: ``path`` a folder is a usage error; a folder that cannot be made or
    written (read-only, no permission, full) raises the file system's own error, which the
    tools print as one ``error:`` line (:func:`~.errors.run_tool`). A probe file is made and
    removed next to ``path``.
    """
    import tempfile
    path = os.fspath(path)
    if osp.isdir(path):
        raise UsageError(f'{option} {path} is a folder: give the path of a file in it, e.g. '
                         f'{osp.join(path, "results.json")}')
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, probe = tempfile.mkstemp(dir=folder, prefix='.mmrobust-write-check-')
    os.close(handle)
    os.remove(probe)


def atomic_bytes(path: PathLike, data: bytes, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_write(path, 'wb', fsync=fsync) as f:
        f.write(data)


def atomic_json(path: PathLike, obj: Any, indent: Optional[int] = 1) -> None:
    """Write ``obj`` as JSON to ``path`` atomically."""
    with atomic_write(path) as f:
        json.dump(obj, f, indent=indent)


def atomic_image(path: PathLike, img: np.ndarray, params: Sequence[int] = ()) -> None:
    """Encode ``img`` (BGR, OpenCV layout) by ``path``'s extension and write it atomically."""
    import cv2
    ext = osp.splitext(os.fspath(path))[1] or '.png'
    ok, buf = cv2.imencode(ext, img, list(params))
    if not ok:
        raise OSError(f'OpenCV cannot encode {os.fspath(path)} as {ext}')
    atomic_bytes(path, buf.tobytes(), fsync=False)


def save_figure(fig: Any, path: PathLike, dpi: int = 120) -> str:
    """Lay out a matplotlib figure, write it atomically (PNG by default) and close it."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    ext = osp.splitext(os.fspath(path))[1].lstrip('.') or 'png'
    with atomic_write(path, 'wb', fsync=False) as f:
        fig.savefig(f, dpi=dpi, format=ext)
    plt.close(fig)
    return os.fspath(path)


class FileLockedError(MMRobustError, RuntimeError):
    """Another process writes this file (it holds the file's lock)."""


def _describe(info: Dict[str, Any]) -> str:
    return (f"pid {info.get('pid', '?')} on {info.get('host', '?')} (user {info.get('user', '?')}, "
            f"since {info.get('since', '?')}): {info.get('command', '?')}")


def _named(path: PathLike, named: Optional[PathLike]) -> str:
    """``path`` as the caller named it, and what it is when that is another name."""
    if named is None or os.fspath(named) == os.fspath(path):
        return os.fspath(path)
    return f'{os.fspath(named)} (the results location {os.fspath(path)})'


def _holder(lock_path: str) -> str:
    try:
        with open(lock_path) as f:
            info = json.load(f)
        return _describe(info) if isinstance(info, dict) and 'pid' in info else \
            'another process (no details recorded yet)'
    except (OSError, ValueError):
        return 'another process (no details recorded yet)'


def _holder_info(fd: int) -> Optional[Dict[str, Any]]:
    """What a lock file (open as ``fd``) says of its last holder, if anything."""
    try:
        info = json.loads(os.pread(fd, 1 << 16, 0) or b'null')
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


@contextmanager
def exclusive_lock(path: PathLike, wait: bool = False,
                   waiting: Optional[Any] = None, named: Optional[PathLike] = None
                   ) -> Iterator[str]:
    """Hold an exclusive lock on ``path`` for the with-block (for a job that writes it).

    The lock is an ``flock`` on ``<path>.lock``, which records who holds it; the OS releases
    it when the holder exits, however it exits, so a killed job leaves no stale lock. Forked
    children (dataloader workers) close their copy of its descriptor at once, so only this
    process holds it. On release the lock file is removed if it is still the one this job
    locked.

    ``flock`` is node-local on some cluster file systems (two nodes can both hold it): a lock
    file left naming a holder on another host is reported through ``waiting`` when taken over.

    Args:
        path: the file the job writes.
        wait: wait for the holder to finish instead of raising.
        waiting: called with a message (who holds it, or who held it on another host).
        named: the name the caller gave ``path`` (another name of it), for the messages.

    Raises:
        FileLockedError: ``path`` is locked and ``wait`` is False; says who holds it.
    """
    import fcntl
    import getpass
    import socket
    import sys
    lock_path = f'{os.fspath(path)}.lock'
    os.makedirs(osp.dirname(osp.abspath(lock_path)), exist_ok=True)
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        _HELD_LOCKS.add(fd)  # NOTE: before the lock: no child forked meanwhile may keep it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(lock_path)
            if not wait:
                _HELD_LOCKS.discard(fd)
                os.close(fd)
                raise FileLockedError(
                    f'{_named(path, named)} is being written by {holder}. Wait for that run '
                    '(or pass --wait to queue behind it), or write to another file.') from None
            if waiting is not None:
                waiting(f'waiting for {holder} to release {_named(path, named)}')
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:  # NOTE: the previous holder may have removed the file we now hold: lock anew
            same = osp.samestat(os.fstat(fd), os.stat(lock_path))
        except FileNotFoundError:
            same = False
        if same:
            break
        _HELD_LOCKS.discard(fd)
        os.close(fd)
    host = socket.gethostname()
    previous = _holder_info(fd)
    if previous and previous.get('host') not in (None, host) and waiting is not None:
        waiting(f'{lock_path} names a holder on another host ({_describe(previous)}), which '
                'this host cannot see: flock may be node-local on this file system. If that '
                'run is still going, stop this one.')
    info = {'pid': os.getpid(), 'host': host, 'user': getpass.getuser(),
            'since': datetime.datetime.now().isoformat(timespec='seconds'),
            'command': ' '.join(sys.argv)}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    try:
        yield lock_path
    finally:
        try:  # NOTE: while still holding it; only the file this job locked, and an error here
            # never hides the with-block's own
            if osp.samestat(os.fstat(fd), os.stat(lock_path)):
                os.unlink(lock_path)
        except OSError:
            pass
        _HELD_LOCKS.discard(fd)
        os.close(fd)


class ResultsMismatchError(MMRobustError, RuntimeError):
    """A results file was written by another evaluation (config, checkpoint, protocol, ...)."""


class ResultsFileError(MMRobustError, ValueError):
    """An existing results file that cannot be read (truncated, not JSON, not an object)."""


class ResultsStore:
    """A JSON results file that a long job fills entry by entry and resumes.

    The file holds the job's ``identity`` (what was evaluated) and its results under
    ``entries_key``; it is rewritten atomically after every :meth:`record`. Opening an existing
    file checks that the identity keys in ``identity_keys`` (default: all of them) match and
    otherwise raises :class:`ResultsMismatchError` with the differences, so results of two
    different evaluations are never mixed.

    Args:
        path: the JSON file.
        identity: what this job evaluates.
        entries_key: the key under which :meth:`record` stores results.
        identity_keys: the identity keys that must match to resume (default: every key).
        identity_key: store the identity under this key (default: at the top level).
        fix: what to tell the user when the identity differs.
    """

    def __init__(self, path: str, identity: Mapping[str, Any], entries_key: str = 'entries',
                 identity_keys: Optional[Sequence[str]] = None,
                 identity_key: Optional[str] = None,
                 fix: str = 'delete the file to start fresh, or write to another path') -> None:
        self.path, self.entries_key, self.identity_key = path, entries_key, identity_key
        identity = dict(identity)
        keys = list(identity) if identity_keys is None else list(identity_keys)
        self.data: Dict[str, Any] = {**self._wrap(identity), entries_key: {}}
        if osp.exists(path):
            try:
                with open(path) as f:
                    old = json.load(f)
            except (ValueError, UnicodeDecodeError) as err:
                raise ResultsFileError(
                    f'{path} cannot be resumed: it is not JSON ({err}), a truncated or foreign '
                    f'file. Move it aside to keep it, then {fix}.') from None
            if not isinstance(old, dict):
                raise ResultsFileError(
                    f'{path} cannot be resumed: it holds a JSON {type(old).__name__}, not the '
                    f'object a results file is. Move it aside to keep it, then {fix}.')
            old_identity = (old.get(identity_key) or {}) if identity_key else old
            diff = [k for k in keys if old_identity.get(k) != identity.get(k)]
            if diff:
                details = '; '.join(f'{k}: file has {old_identity.get(k)!r}, this run '
                                    f'{identity.get(k)!r}' for k in diff)
                raise ResultsMismatchError(
                    f'{path} holds results of a different evaluation ({details}). Refusing to '
                    f'mix them: {fix}.')
            self.data = {**old, **self._wrap(identity)}
            self.data.setdefault(entries_key, {})

    def _wrap(self, identity: Dict[str, Any]) -> Dict[str, Any]:
        return {self.identity_key: identity} if self.identity_key else identity

    @property
    def identity(self) -> Dict[str, Any]:
        """The store's identity (what its entries belong to)."""
        return self.data[self.identity_key] if self.identity_key else self.data

    @property
    def entries(self) -> Dict[str, Any]:
        """The recorded entries."""
        return self.data[self.entries_key]

    def done(self, *key: str) -> bool:
        """Whether the (possibly nested) entry ``key`` is recorded."""
        node: Any = self.entries
        for part in key:
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    def record(self, *key: str, value: Any, save: bool = True) -> None:
        """Store ``value`` under the nested ``key`` (and rewrite the file)."""
        node = self.entries
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
        if save:
            self.save()

    def save(self) -> None:
        """Rewrite the file atomically, with ``created`` / ``updated`` times."""
        now = datetime.datetime.now().isoformat(timespec='seconds')
        self.data['created'] = self.data.get('created') or now
        self.data['updated'] = now
        atomic_json(self.path, self.data)
