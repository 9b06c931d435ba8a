"""Shared fixtures: the repository root, the toy datasets, and a runner for the CLI tools."""
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / 'configs'
# model configs (mmdet / mmseg) and tokenizer-training configs (VQTokenizerTrainer)
TOKENIZER_CONFIGS = sorted((CONFIGS / 'tokenizers').glob('*.py'))
ALL_CONFIGS = sorted(p for p in CONFIGS.rglob('*.py')
                     if '_base_' not in p.parts and p not in TOKENIZER_CONFIGS)


# the README demo's detector (tools/demo_toy.sh), trained once per session by `trained_toy_detector`
DEMO_DET_CFG = 'configs/toy/mask-rcnn_fan-t-hybrid_fpn_toy-coco.py'


def config_id(path: Path) -> str:
    return str(path.relative_to(CONFIGS))


@pytest.fixture(scope='session')
def toy_data() -> Dict[str, Path]:
    """The toy datasets under the repository's data/ folder, generated once (idempotent)."""
    from mmrobust.datasets import generate_toy_dataset
    roots = {}
    for name in ('toy_coco', 'toy_cityscapes'):
        roots[name] = REPO / 'data' / name
        generate_toy_dataset(name, str(roots[name]), seed=0)
    return roots


@pytest.fixture
def in_repo(monkeypatch) -> Path:
    """Run the test from the repository root, where configs resolve `data/...`."""
    monkeypatch.chdir(REPO)
    return REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def run_cmd(args, timeout: float = 600, env: Optional[Dict[str, str]] = None,
            check: bool = True) -> subprocess.CompletedProcess:
    """Run a command from the repository root; on failure show its output.

    ``timeout`` is a safety net (default: 10x or more what the tools' test runs take here);
    running past it fails the test with TIMEOUT, never with an assertion about results.
    """
    # NOTE: the 2-process launchers get one thread per process (torchrun's own default): two
    # processes of two threads each on two cores made the distributed tests ~2x slower
    multi = any(str(a).endswith(('dist_train.sh', 'dist_test.sh')) for a in args)
    threads = '1' if multi else os.environ.get('OMP_NUM_THREADS', '2')
    full_env = {**os.environ, 'PYTHONPATH': str(REPO), 'PYTHON': sys.executable,
                'OMP_NUM_THREADS': threads, **(env or {})}
    try:
        proc = subprocess.run([str(a) for a in args], cwd=REPO, env=full_env, timeout=timeout,
                              capture_output=True, text=True)
    except subprocess.TimeoutExpired as err:
        # NOTE: a safety net, not a speed test: say so, so that nobody reads it as a wrong result
        def tail(x):
            return (x.decode(errors='replace') if isinstance(x, bytes) else x or '')[-4000:]
        pytest.fail(f'TIMEOUT (not a wrong result): {" ".join(map(str, args))} was still running '
                    f'after {timeout:.0f} s, the safety limit for this command; the machine is '
                    f'probably overloaded or much slower than the ones the limit was sized for.\n'
                    f'--- stdout so far ---\n{tail(err.stdout)}\n--- stderr so far ---\n'
                    f'{tail(err.stderr)}')
    if check and proc.returncode != 0:
        pytest.fail(f'command failed ({proc.returncode}): {" ".join(map(str, args))}\n'
                    f'--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}')
    return proc


def run_tool(tool: str, *args, **kwargs) -> subprocess.CompletedProcess:
    return run_cmd([sys.executable, REPO / 'tools' / tool, *args], **kwargs)


@pytest.fixture(scope='session')
def trained_toy_detector(toy_data, tmp_path_factory) -> Path:
    """The README demo's run: the toy FAN-T-Hybrid Mask R-CNN trained 300 iterations from
    scratch (~4 min, once).

    Returns its work dir (``iter_300.pth``, logs). Shared by the demo-learns test and the
    robustness-evaluation tests, which need a model that actually detects something.
    """
    work = tmp_path_factory.mktemp('demo') / 'learn'
    # NOTE: 250-410 s on the 2-core machines measured; the limit allows a machine ~6x slower
    run_tool('train.py', DEMO_DET_CFG, '--work-dir', work,
             '--cfg-options', 'train_dataloader.num_workers=0',
             'train_dataloader.persistent_workers=False', 'val_dataloader.num_workers=0',
             'val_dataloader.persistent_workers=False', timeout=2400)
    return work


def pytest_collection_modifyitems(config, items) -> None:
    """A test that needs the trained demo detector is an end-to-end test: the `slow` tier."""
    for item in items:
        if 'trained_toy_detector' in getattr(item, 'fixturenames', ()):
            item.add_marker(pytest.mark.slow)
