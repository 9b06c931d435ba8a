"""Shared fixtures: the toy datasets, the repository root as working folder, the demo detector.

The helpers are the package ``helpers`` (``from helpers import run_tool``); the harness (time
limits, watchdog, no process left behind) is its plugin ``helpers.harness``.
"""
import fcntl
from pathlib import Path
from typing import Dict

import pytest

# the helpers' assertions (assert_user_error, ...) report as the tests' own do
pytest.register_assert_rewrite('helpers')

from helpers import DEMO_DET_CFG, REPO, run_tool  # noqa: E402

pytest_plugins = ('helpers.harness',)


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
    """Run the test from the repository root, where configs resolve ``data/...``."""
    monkeypatch.chdir(REPO)
    return REPO


@pytest.fixture(scope='session')
def trained_toy_detector(toy_data, tmp_path_factory) -> Path:
    """The README demo's run: the toy FAN-T-Hybrid Mask R-CNN trained 300 iterations from scratch.

    ~4 min, once.

    Returns its work dir (``iter_300.pth``, logs). Shared by the demo-learns test and the
    robustness-evaluation tests, which need a model that actually detects something.
    """
    from helpers import harness  # NOTE: here, not above: the plugin is imported by pytest first

    # whatever happens next, the next user does not train
    harness.STARTED.add('trained_toy_detector')
    work = tmp_path_factory.mktemp('demo') / 'learn'
    # NOTE: 250-410 s on the 2-core machines measured; the limit allows a machine ~6x slower
    run_tool('train.py', DEMO_DET_CFG, '--work-dir', work,
             '--cfg-options', 'train_dataloader.num_workers=0',
             'train_dataloader.persistent_workers=False', 'val_dataloader.num_workers=0',
             'val_dataloader.persistent_workers=False', timeout=2400)
    return work


def pytest_itemcollected(item) -> None:
    """A test that needs the trained demo detector is an end-to-end test: the ``slow`` tier.

    Its tests run in one pytest-xdist worker (``--dist loadgroup``), which trains the detector once.
    """
    # NOTE: here rather than in pytest_collection_modifyitems, where pytest-xdist may read the
    # group before this conftest adds it
    if 'trained_toy_detector' in getattr(item, 'fixturenames', ()):
        item.add_marker(pytest.mark.slow)
        item.add_marker(pytest.mark.xdist_group('trained_toy_detector'))
