"""Which mmrobust a tool runs: the checkout the tool belongs to, said at start-up."""
import multiprocessing
import os
import os.path as osp
import sys
from pathlib import Path

__all__ = ['checkout_root', 'report_origin']


def checkout_root(tool_file: str) -> Path:
    """The repository a file under ``tools/`` belongs to (the parent of its ``tools`` folder)."""
    path = Path(tool_file).resolve()
    for parent in path.parents:
        if parent.name == 'tools':
            return parent.parent
    raise ValueError(f'{tool_file} is not under a tools/ folder')


def report_origin(tool_file: str) -> str:
    """Print (on rank 0, to stderr) which mmrobust ``tool_file`` runs; returns the package path.

    Every tool puts its repository root first on ``sys.path`` before importing mmrobust, so a
    second clone's ``tools/x.py`` runs that clone's code even when another clone is installed in
    editable mode. Should mmrobust come from elsewhere all the same (imported before the tool
    ran, e.g. by a ``sitecustomize``), the line says so.
    """
    from ..version import __version__
    # NOTE: this module's package is the mmrobust that was imported (not an import of the
    # root package from below it)
    package = osp.dirname(osp.dirname(osp.abspath(__file__)))
    root = checkout_root(tool_file)
    # NOTE: an installed mmrobust carries its tools in mmrobust/.mim/tools (mim runs them there)
    own = root.parent if root.name == '.mim' else root / 'mmrobust'
    # NOTE: once per job: not on other ranks, not in worker processes that re-import the tool
    first = os.environ.get('RANK', '0') == '0' and os.environ.get('LOCAL_RANK', '0') == '0'
    if first and multiprocessing.parent_process() is None:
        note = ''
        if not (own.is_dir() and osp.samefile(package, own)):
            note = (f' -- NOT the checkout of this tool ({own}): mmrobust was imported before '
                    'the tool could put its own checkout first')
        print(f'mmrobust {__version__} from {package}{note}', file=sys.stderr)
    return package
