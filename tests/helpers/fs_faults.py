"""File-system faults injected into this process: a read-only or full disk under one folder.

As root (CI, containers) permissions do not stop a write and mounting needs privileges, so the
writes themselves fail: every way the tools write (``open`` for writing, ``os.open`` with a
write flag, folders made or removed, files replaced, renamed or removed) under ``folder``
raises ``OSError(code)`` and is recorded.
"""
import builtins
import errno
import io
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, List, Optional

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


@contextmanager
def failing_writes(folder, code: int = errno.EROFS,
                   when: Optional[Callable[[str, str], bool]] = None) -> Iterator[List[str]]:
    """Writes under ``folder`` fail with ``code`` for the with-block; yields the paths tried.

    ``when(path, operation)`` (``open`` or the ``os`` function's name): only the writes it
    accepts (it may count them, or look at the disk as the fault strikes).
    """
    root = os.path.realpath(folder)
    tried: List[str] = []

    def inside(path, operation: str) -> bool:
        if isinstance(path, int):
            return False
        full = os.path.realpath(os.fspath(path))
        return (full == root or full.startswith(root + os.sep)) and (
            when is None or when(full, operation))

    def refuse(path) -> None:
        tried.append(os.fspath(path))
        raise OSError(code, os.strerror(code), os.fspath(path))

    real = {name: getattr(os, name) for name in (
        'open', 'makedirs', 'mkdir', 'replace', 'rename', 'remove', 'unlink', 'rmdir')}
    real_open = builtins.open

    def open_(file, mode='r', *args, **kwargs):
        if any(c in mode for c in 'wax+') and inside(file, 'open'):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def os_open(path, flags, *args, **kwargs):
        if flags & _WRITE_FLAGS and inside(path, 'open'):
            refuse(path)
        return real['open'](path, flags, *args, **kwargs)

    def guarded(name):
        def call(path, *args, **kwargs):
            targets = [path] + [a for a in args[:1] if isinstance(a, (str, Path))]
            if any(inside(t, name) for t in targets):
                if name == 'makedirs' and kwargs.get('exist_ok') and os.path.isdir(path):
                    return None  # NOTE: a folder that exists is no write
                refuse(path)
            return real[name](path, *args, **kwargs)
        return call

    builtins.open = io.open = open_  # NOTE: pathlib and zipfile call io.open
    os.open = os_open
    for name in real:
        if name != 'open':
            setattr(os, name, guarded(name))
    try:
        yield tried
    finally:
        builtins.open = io.open = real_open
        for name, fn in real.items():
            setattr(os, name, fn)
