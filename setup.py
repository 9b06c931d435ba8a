"""Puts ``configs/``, ``tools/`` and ``model-index.yml`` inside the package, as OpenMMLab does.

The metadata is in ``pyproject.toml``; this file only adds ``mmrobust/.mim/`` before setuptools
collects the package: copies for a wheel or an sdist (an installed mmrobust then carries its
configs and tools, which ``mim train mmrobust CONFIG``, ``mim test`` and ``mim run`` use), links
for an editable install (the checkout's own folders, so an edit shows at once).
"""
import os
import os.path as osp
import shutil
import sys

from setuptools import setup

ROOT = osp.dirname(osp.abspath(__file__))
MIM_FILES = ('configs', 'tools', 'model-index.yml')


def add_mim_extension() -> None:
    """Fill ``mmrobust/.mim`` with copies (wheel, sdist) or links (editable) of MIM_FILES."""
    if any(c in sys.argv for c in ('develop', 'editable_wheel')):
        mode = 'symlink'
    elif any(c in sys.argv for c in ('bdist_wheel', 'sdist', 'build', 'build_py')):
        mode = 'copy'
    else:
        return
    mim = osp.join(ROOT, 'mmrobust', '.mim')
    os.makedirs(mim, exist_ok=True)
    for name in MIM_FILES:
        src, dst = osp.join(ROOT, name), osp.join(mim, name)
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        if mode == 'symlink':
            os.symlink(osp.relpath(src, mim), dst)
        elif osp.isdir(src):
            # NOTE: caches and a user's outputs under tools/ are not part of the package
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
        else:
            shutil.copyfile(src, dst)


if __name__ == '__main__':
    add_mim_extension()
    setup()
