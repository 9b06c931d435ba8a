"""What the suite builds once per run for all its pytest-xdist workers: a folder and a file lock.

The trained demo detector and the initial checkpoints are built by the first worker that asks;
the others wait on its lock and use the same files (``tests/conftest.py`` points
:data:`SHARED_DIR` at the run's base temporary folder, which pytest removes with its old runs).
"""
import fcntl
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import pytest

#: the run's shared folder (set by the conftest's session fixture; else one per process)
SHARED_DIR: Optional[Path] = None


def shared_dir() -> Path:
    """The folder every worker of this run shares."""
    global SHARED_DIR
    if SHARED_DIR is None:  # NOTE: a run without the suite's conftest: this process's own
        SHARED_DIR = Path(tempfile.mkdtemp(prefix='mmrobust-tests-'))
    SHARED_DIR.mkdir(parents=True, exist_ok=True)
    return SHARED_DIR


@contextmanager
def locked(name: str) -> Iterator[None]:
    """An exclusive lock on ``name`` among this run's workers (held until the block ends)."""
    with open(shared_dir() / f'{name}.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build_once(name: str, build: Callable[[Path], None]) -> Path:
    """``<shared>/name``, built by ``build(path)`` in the first worker that asks for it.

    The others wait on its lock; ``<name>.done`` marks it built (built in place: a training run
    records its own paths). A build that failed is not retried by the next worker (that would
    repeat minutes of work to fail again): it fails with the first one's error.
    """
    target = shared_dir() / name
    done, failed = target.with_name(f'{name}.done'), target.with_name(f'{name}.failed')
    with locked(name):
        if failed.exists():
            pytest.fail(f'building the shared {name} failed in another worker of this run:\n'
                        f'{failed.read_text()[-4000:]}')
        if not done.exists():
            if target.is_dir():  # NOTE: a build killed half-way in an earlier worker
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            try:
                build(target)
            except BaseException as err:
                failed.write_text(f'{type(err).__name__}: {err}')
                raise
            done.touch()
    return target
