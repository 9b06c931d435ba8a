"""The shared mechanisms of mmrobust.utils and mmrobust.models.

Atomic writes, the resumable results store, leaf datasets, arch tables, from-scratch init and the
pixel space patch.
"""
import json
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.nn as nn

from mmrobust.models.data_preprocessors import (
    PixelSpace,
    patch_forward,
    patched_forward,
    perturb_in_pixels,
)
from mmrobust.models.utils import init_trunc_normal_, resolve_arch
from mmrobust.utils import (
    TMP_MARK,
    ResultsMismatchError,
    ResultsStore,
    atomic_json,
    atomic_write,
    leaf_datasets,
)

from helpers.paths import REPO


def test_atomic_write_replaces_whole_files_and_keeps_the_old_one_on_error(tmp_path):
    path = tmp_path / 'sub' / 'out.json'
    atomic_json(path, {'a': 1})
    assert json.loads(path.read_text()) == {'a': 1}
    with pytest.raises(RuntimeError, match='boom'):
        with atomic_write(path) as f:
            f.write('{"half": ')
            raise RuntimeError('boom')
    # the old content survives and no temporary file is left behind
    assert json.loads(path.read_text()) == {'a': 1}
    assert not [p for p in os.listdir(path.parent) if TMP_MARK in p]
    with pytest.raises(ValueError, match='whole files'):
        with atomic_write(path, 'a'):
            pass


def test_results_store_resumes_and_refuses_another_identity(tmp_path):
    path = str(tmp_path / 'r.json')
    store = ResultsStore(path, {'model': 'a', 'seed': 0, 'note': 'x'}, entries_key='cells',
                         identity_keys=('model', 'seed'))
    store.record('fog', '3', value={'AP': 0.5})
    again = ResultsStore(path, {'model': 'a', 'seed': 0, 'note': 'changed'},
                         entries_key='cells', identity_keys=('model', 'seed'))
    assert again.done('fog', '3') and not again.done('fog', '4') and not again.done('snow')
    assert again.entries['fog']['3'] == {'AP': 0.5} and again.data['note'] == 'changed'
    with pytest.raises(ResultsMismatchError, match="seed: file has 0, this run 1.*delete"):
        ResultsStore(path, {'model': 'a', 'seed': 1}, entries_key='cells',
                     identity_keys=('model', 'seed'))
    # an identity kept under its own key (the perturbation studies' layout)
    nested = str(tmp_path / 'n.json')
    ResultsStore(nested, {'grid': 3}, 'settings', identity_key='identity').record('clean',
                                                                                  value={})
    assert json.loads(open(nested).read())['identity'] == {'grid': 3}
    with pytest.raises(ResultsMismatchError, match='grid'):
        ResultsStore(nested, {'grid': 5}, 'settings', identity_key='identity')


def test_leaf_datasets_walk_wrappers_and_concatenations():
    a, b, c = dict(type='A', pipeline=[]), dict(type='B'), dict(type='C')
    cfg = dict(type='RepeatDataset', times=2,
               dataset=dict(type='ConcatDataset', datasets=[a, dict(type='X', dataset=b), c]))
    leaves = leaf_datasets(cfg)
    assert leaves == [a, b, c] and leaves[0] is a  # the config's own dicts
    assert leaf_datasets(a) == [a] and leaf_datasets(None) == []


def test_resolve_arch_names_the_choices():
    zoo = {'tiny': dict(depth=2, width=8), 'small': dict(depth=4, width=16)}
    assert resolve_arch('tiny', zoo, 'Net') == ('tiny', {'depth': 2, 'width': 8})
    assert resolve_arch(dict(depth=1, width=4), zoo, 'Net') == ('custom',
                                                                {'depth': 1, 'width': 4})
    assert resolve_arch(dict(depth=1, width=4, norm='bn'), zoo, 'Net', optional=('norm', ))[1][
        'norm'] == 'bn'
    with pytest.raises(KeyError, match=r"unknown Net arch 'huge'.*\['small', 'tiny'\]"):
        resolve_arch('huge', zoo, 'Net')
    with pytest.raises(KeyError, match='needs exactly the keys'):
        resolve_arch(dict(depth=1), zoo, 'Net')
    with pytest.raises(KeyError, match='needs exactly the keys'):
        resolve_arch(dict(depth=1, width=4, extra=0), zoo, 'Net')


def test_init_trunc_normal_inits_layers_norms_and_extras_and_skips_frozen_parts():
    class WithTable(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Parameter(torch.zeros(100))

    net = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.Conv2d(3, 8, 3), WithTable())
    with torch.no_grad():
        net[1].weight.fill_(3.)
    init_trunc_normal_(net, extra={WithTable: ('table', )})
    assert 0.017 < net[0].weight.std() < 0.023 and net[0].bias.abs().sum() == 0
    assert torch.all(net[1].weight == 1) and torch.all(net[1].bias == 0)
    assert net[2].weight.std() > 0.05  # not among `layers`: PyTorch's own init kept
    assert 0.01 < net[3].table.std() < 0.03
    # a frozen part (a tokenizer) keeps its weights, the rest is initialised
    frozen = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64))
    with torch.no_grad():
        frozen[1].weight.fill_(3.)
    kept = [p.detach().clone() for p in frozen.parameters()]
    outer = nn.Sequential(nn.Linear(64, 64), frozen)
    init_trunc_normal_(outer, skip=[frozen])
    assert all(torch.equal(p, k) for p, k in zip(frozen.parameters(), kept))
    assert 0.017 < outer[0].weight.std() < 0.023


class _Pre(nn.Module):
    """A stand-in data preprocessor: normalises with mean 0 / std 255, BGR (no flip)."""

    def __init__(self) -> None:
        super().__init__()
        self._enable_normalize = True
        self.register_buffer('mean', torch.zeros(3, 1, 1))
        self.register_buffer('std', torch.full((3, 1, 1), 255.))

    def forward(self, data: dict, training: bool = False) -> dict:
        return dict(data, inputs=data['inputs'].float() / 255.)


def test_patch_forward_transforms_the_output_and_undoes_cleanly():
    pre = _Pre()
    keys = set(pre.state_dict())
    seen = []
    undo = patch_forward(pre, lambda out, training: (seen.append(training), out)[1])
    assert set(pre.state_dict()) == keys  # no wrapper module, same state-dict keys
    pre(dict(inputs=torch.zeros(1, 3, 2, 2)), True)
    assert seen == [True]
    with pytest.raises(RuntimeError, match='patched already'):
        patch_forward(pre, lambda out, training: out)
    undo()
    assert 'forward' not in pre.__dict__
    with patched_forward(pre, lambda out, training: dict(out, inputs=out['inputs'] + 1)):
        assert pre(dict(inputs=torch.zeros(1, 3, 2, 2)))['inputs'].min() == 1
    assert pre(dict(inputs=torch.zeros(1, 3, 2, 2)))['inputs'].max() == 0


def test_perturb_in_pixels_leaves_the_padding_alone():
    from mmengine.structures import BaseDataElement
    pre = _Pre()
    space = PixelSpace(pre)
    x = torch.full((1, 3, 4, 6), 0.5)
    sample = BaseDataElement(metainfo=dict(img_shape=(2, 3)))
    out = perturb_in_pixels(space, dict(inputs=x, data_samples=[sample]),
                            lambda p, m: torch.ones_like(p))['inputs']
    assert torch.all(out[..., :2, :3] == 1)
    assert torch.all(out[..., 2:, :] == 0.5) and torch.all(out[..., :, 3:] == 0.5)


# NOTE: the module by its path (standard library only), not the package: no torch to import
_WATCHER = '''
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location('processes', 'mmrobust/utils/processes.py')
processes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(processes)
processes.exit_with_process(int(sys.argv[1]), poll_s=0.05)
print('watching', flush=True)
time.sleep(120)
'''


def test_a_process_exits_with_one_it_watches_that_is_not_its_parent():
    """What a fork server's child does: its parent is the server, its owner another process."""
    owner = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])
    watcher = subprocess.Popen([sys.executable, '-c', _WATCHER, str(owner.pid)],
                               stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert watcher.stdout.readline() == 'watching\n'
        time.sleep(0.3)
        assert watcher.poll() is None  # the owner lives: so does the watcher
        owner.kill()
        owner.wait()
        assert watcher.wait(timeout=20) == 1
        # an owner already gone when the watch starts: at once
        gone = subprocess.run([sys.executable, '-c', _WATCHER, str(owner.pid)], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert gone.returncode == 1 and 'watching' not in gone.stdout
    finally:
        for proc in (owner, watcher):
            proc.kill()
            proc.wait()
