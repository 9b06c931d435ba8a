"""Shared fixtures: the toy datasets, the repository root as working folder, the demo detector.

The helpers are the package ``helpers`` (``from helpers import run_tool``); the harness (time
limits, watchdog, no process left behind) is its plugin ``helpers.harness``; ``helpers.config_memo``
memoises what mmengine recomputes for every config the tests' tools load.
"""
import fcntl
import os
from pathlib import Path
from typing import Dict

import pytest

# the helpers' assertions (assert_user_error, ...) report as the tests' own do
pytest.register_assert_rewrite('helpers')

from helpers import DEMO_DET_CFG, REPO, run_tool, shared  # noqa: E402
from helpers.shared import build_once  # noqa: E402

# NOTE: config_memo: mmengine's config formatting and metafile lookups, paid once per text
pytest_plugins = ('helpers.harness', 'helpers.config_memo')


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


@pytest.fixture(scope='session', autouse=True)
def shared_folder(tmp_path_factory) -> Path:
    """The folder this run's pytest-xdist workers share (:mod:`helpers.shared`).

    In the run's base temporary folder, which pytest removes with its old runs.
    """
    base = tmp_path_factory.getbasetemp()
    # NOTE: a worker's base is <run>/popen-gwN; the run's folder is common to all workers
    shared.SHARED_DIR = (base.parent if os.environ.get('PYTEST_XDIST_WORKER') else base) / 'shared'
    return shared.SHARED_DIR


@pytest.fixture
def in_repo(monkeypatch) -> Path:
    """Run the test from the repository root, where configs resolve ``data/...``."""
    monkeypatch.chdir(REPO)
    return REPO


@pytest.fixture(scope='session')
def trained_toy_detector(toy_data, shared_folder) -> Path:
    """The README demo's run: the toy FAN-T-Hybrid Mask R-CNN trained 300 iterations from scratch.

    ~4 min, once.

    Returns its work dir (``iter_300.pth``, logs). Shared by the demo-learns test and the
    robustness-evaluation tests, which need a model that actually detects something: trained
    once per run, by the first worker that asks (the others wait on its lock:
    :func:`helpers.shared.build_once`).
    """
    from helpers import harness  # NOTE: here, not above: the plugin is imported by pytest first

    # whatever happens next, the next user in this process does not train
    harness.STARTED.add('trained_toy_detector')

    def train(work: Path) -> None:
        # NOTE: 250-410 s on the 2-core machines measured; the limit allows a machine ~6x slower
        run_tool('train.py', DEMO_DET_CFG, '--work-dir', work,
                 '--cfg-options', 'train_dataloader.num_workers=0',
                 'train_dataloader.persistent_workers=False', 'val_dataloader.num_workers=0',
                 'val_dataloader.persistent_workers=False', timeout=2400)
    return build_once('trained_toy_detector', train)


# What CI runs on the floor stack (torch 2.1 + mmcv 2.1.0, ``tools/setup_env.sh --stack
# oldest``) as ``-m floor``: checkpoint loading, every config built (a training forward pass for
# the toy ones), training through tools/train.py with resume and tools/test.py, a detection and a
# segmentation robustness run, and the install's ranges. A file's tests, all of them when none
# are named.
# NOTE: a subset, not the quick tier: chosen when the floor's set-up (torch 2.1 with its CUDA
# wheels, mmcv built from source) left no room for it in an hour of CI on a fresh machine (58 min
# then, 45 on 810a2f1, the quick tier ~4 more: CONTRIBUTING.md, CI)
FLOOR = {
    'tests/test_checkpoint.py': (),
    'tests/test_strict_load.py': (),
    'tests/test_converters.py': (
        'test_mmdet_resnet_checkpoints_load_unchanged',
        'test_mmdet_backbones_load_released_layouts_strictly',
        'test_efficientnet_lite_loads_an_efficientdet_checkpoint_and_its_own_layout'),
    'tests/test_configs.py': (),
    'tests/test_install.py': (
        'test_this_environment_satisfies_the_ranges',
        'test_installing_the_checkout_keeps_this_environments_torch_and_mmcv'),
    'tests/test_tools.py': (
        'test_detection_train_test_and_resume', 'test_flop_counter_counts_fused_cpu_attention'),
    'tests/test_evaluation/test_job_lifecycle.py': (
        'test_every_coco_backend_computes_in_the_worker_as_in_the_loop',),
    'tests/test_evaluation/test_shifts.py': (
        'test_shift_cells_beside_corruption_cells_one_file_one_report',),
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Under ``-m floor``, a name in ``FLOOR`` that no collected test has is an error, not a gap."""
    if 'floor' not in (config.option.markexpr or ''):
        return
    found = {(i.nodeid.split('::')[0], getattr(i, 'originalname', i.name)) for i in items}
    missing = [f'{f}::{n}' for f, names in FLOOR.items() for n in names if (f, n) not in found]
    missing += [f for f in FLOOR if not any(g == f for g, _ in found)]
    if missing:
        raise pytest.UsageError('tests/conftest.py FLOOR names tests that were not collected '
                                f'(renamed or removed? collect all of tests/): {missing}')


def pytest_itemcollected(item) -> None:
    """A test that needs the trained demo detector is an end-to-end test: the ``slow`` tier.

    Its tests run in one pytest-xdist worker (``--dist loadgroup``), which trains the detector once.
    The tests of ``FLOOR`` are marked ``floor``.
    """
    names = FLOOR.get(item.nodeid.split('::')[0])
    if names is not None and (not names or getattr(item, 'originalname', item.name) in names):
        item.add_marker(pytest.mark.floor)
    # NOTE: here rather than in pytest_collection_modifyitems, where pytest-xdist may read the
    # group before this conftest adds it
    if 'trained_toy_detector' in getattr(item, 'fixturenames', ()):
        item.add_marker(pytest.mark.slow)
        item.add_marker(pytest.mark.xdist_group('trained_toy_detector'))
