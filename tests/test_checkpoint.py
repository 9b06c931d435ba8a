"""Checkpoint safety: mmengine's own files load, malicious pickles are refused.

Through torch's extensible ``weights_only`` allow-list (torch >= 2.5) and through the restricted
unpickler that stands in for it on older torch (torch 2.1, the floor): the ``loader`` fixture
runs a test both ways on this torch.
"""
import argparse
import os
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn as nn
from mmengine.model import BaseModel
from mmengine.runner import Runner, load_checkpoint

import mmrobust  # noqa: F401  (installs the safe loader)
from mmrobust.utils import NotACheckpointError, UnsafeCheckpointError, safe_load

from helpers import run_tool


@pytest.fixture(params=['weights_only', 'unpickler'])
def loader(request, monkeypatch):
    """The path safe_load takes: torch's allow-list, or the unpickler of torch < 2.5."""
    import mmrobust.utils.checkpoint as ckpt
    if request.param == 'weights_only' and not hasattr(torch.serialization, 'safe_globals'):
        pytest.skip(f'torch {torch.__version__} cannot extend its weights_only allow-list')
    monkeypatch.setattr(ckpt, 'EXTENSIBLE_WEIGHTS_ONLY', request.param == 'weights_only')
    return request.param


class _Evil:
    """Unpickling this runs a shell command that creates ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}',))


class _TinyModel(BaseModel):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.bn = nn.BatchNorm1d(2)

    def forward(self, inputs, labels=None, mode='tensor'):
        out = self.linear(self.bn(inputs))
        if mode == 'loss':
            return dict(loss=((out - labels) ** 2).mean())
        return out


def _runner(work_dir, max_iters, **kwargs):
    g = torch.Generator().manual_seed(0)
    data = [dict(inputs=torch.randn(2, generator=g), labels=torch.randn(1, generator=g))
            for _ in range(16)]
    torch.manual_seed(0)  # same initial weights in every run
    return Runner(
        model=_TinyModel(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=data, sampler=dict(type='InfiniteSampler', seed=0),
                              batch_size=4, collate_fn=dict(type='default_collate')),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9)),
        param_scheduler=dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0,
                             end=8),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=4),
                           logger=dict(type='LoggerHook', interval=1)),
        log_processor=dict(by_epoch=False), randomness=dict(seed=0),
        experiment_name=f'exp_{max_iters}_{os.path.basename(str(work_dir))}', **kwargs)


def test_mmengine_checkpoint_roundtrip_and_resume(tmp_path, monkeypatch):
    full = _runner(tmp_path / 'full', 8)
    full.train()
    part = _runner(tmp_path / 'part', 4)
    part.train()
    ckpt_path = tmp_path / 'part' / 'iter_4.pth'
    ckpt = safe_load(str(ckpt_path))
    # the types torch's weights_only loader refuses without the allow-list are really there
    hub = ckpt['message_hub']['log_scalars']
    assert type(next(iter(hub.values()))).__name__ == 'HistoryBuffer'
    assert ckpt['meta']['iter'] == 4
    # the same file through the unpickler of torch < 2.5: the same content
    import mmrobust.utils.checkpoint as loader
    monkeypatch.setattr(loader, 'EXTENSIBLE_WEIGHTS_ONLY', False)
    again = safe_load(str(ckpt_path))
    monkeypatch.undo()
    assert again['meta'] == ckpt['meta'] and list(again) == list(ckpt)
    assert type(next(iter(again['message_hub']['log_scalars'].values()))).__name__ == \
        'HistoryBuffer'
    for k, v in ckpt['state_dict'].items():
        torch.testing.assert_close(v, again['state_dict'][k])

    resumed = _runner(tmp_path / 'part', 8, resume=True, load_from=str(ckpt_path))
    resumed.train()
    assert resumed.iter == 8
    final_full = safe_load(str(tmp_path / 'full' / 'iter_8.pth'))
    final_resumed = safe_load(str(tmp_path / 'part' / 'iter_8.pth'))
    # same iteration counter, LR schedule, optimizer state and weights as an uninterrupted run
    assert final_resumed['meta']['iter'] == final_full['meta']['iter'] == 8
    assert final_resumed['param_schedulers'] == final_full['param_schedulers']
    opt_full, opt_res = final_full['optimizer'], final_resumed['optimizer']
    assert opt_full['param_groups'] == opt_res['param_groups']
    for k, state in opt_full['state'].items():
        torch.testing.assert_close(state['momentum_buffer'], opt_res['state'][k]['momentum_buffer'])
    for k, v in final_full['state_dict'].items():
        torch.testing.assert_close(v, final_resumed['state_dict'][k])


def test_third_party_checkpoints_load(tmp_path, loader):
    model = _TinyModel()
    plain = tmp_path / 'plain.pth'
    torch.save(OrderedDict(model.state_dict()), plain)
    # timm-style: wrapped, with `args` namespace, numpy scalars and a `module.` prefix
    wrapped = tmp_path / 'timm_style.pth.tar'
    torch.save(dict(state_dict={f'module.{k}': v for k, v in model.state_dict().items()},
                    args=argparse.Namespace(lr=1e-3, model='fan'), epoch=np.int64(299),
                    metric=np.float64(80.1), hist=np.zeros(3)), wrapped)
    target = _TinyModel()
    load_checkpoint(target, str(plain), strict=True)
    load_checkpoint(target, str(wrapped), strict=True, revise_keys=[(r'^module\.', '')])
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, target.state_dict()[k])
    assert safe_load(str(wrapped))['args'].model == 'fan'


@pytest.mark.parametrize('zipfile', [True, False], ids=['zip', 'legacy'])
def test_malicious_checkpoint_is_refused(tmp_path, zipfile, loader):
    marker = tmp_path / 'pwned'
    path = tmp_path / 'evil.pth'
    torch.save(dict(state_dict=_TinyModel().state_dict(), meta=_Evil(marker)), path,
               _use_new_zipfile_serialization=zipfile)
    with pytest.raises(UnsafeCheckpointError, match=r'(?s)Refusing to load checkpoint.*system'):
        load_checkpoint(_TinyModel(), str(path))
    with pytest.raises(UnsafeCheckpointError, match='clean_checkpoint.py'):
        from mmengine.runner.checkpoint import _load_checkpoint  # resume's loader
        _load_checkpoint(str(path), map_location='cpu')
    assert not marker.exists(), 'the payload ran'


@pytest.mark.slow
def test_clean_checkpoint_tool(tmp_path):
    src, dst = tmp_path / 'src.pth', tmp_path / 'dst.pth'
    state = _TinyModel().state_dict()
    torch.save(dict(state_dict=state, args=argparse.Namespace(lr=0.1), meta=os.path.join,
                    arr=np.arange(3)), src)
    proc = run_tool('model_converters/clean_checkpoint.py', src, dst, check=False)
    assert proc.returncode != 0 and '--trust-source' in proc.stderr and not dst.exists()
    proc = run_tool('model_converters/clean_checkpoint.py', src, dst, '--trust-source')
    assert 'dropped meta' in proc.stdout
    out = safe_load(str(dst))
    assert out['args'] == {'lr': 0.1} and out['meta'] is None
    torch.testing.assert_close(out['arr'], torch.arange(3))
    torch.testing.assert_close(out['state_dict']['linear.weight'], state['linear.weight'])


class _SneakyGetattr:
    def __reduce__(self):
        from mmengine.logging import HistoryBuffer
        return (getattr, (HistoryBuffer, '__init__'))


def test_getattr_only_reaches_history_buffer_statistics(tmp_path, loader):
    path = tmp_path / 'sneaky.pth'
    torch.save({'x': _SneakyGetattr()}, path)
    with pytest.raises(UnsafeCheckpointError, match='only HistoryBuffer statistics'):
        safe_load(str(path))


@pytest.mark.parametrize('content,says', [
    (b'', 'an empty file'),
    (b'hello, I am text', "not a torch.save file \\(it starts with b'hello, I'"),
    (None, 'a plain Python pickle'),
])
def test_what_is_no_torch_file_is_named_as_such(tmp_path, content, says, loader):
    import pickle
    path = tmp_path / 'model.pth'
    path.write_bytes(pickle.dumps({'state_dict': {'w': np.zeros(2)}}) if content is None
                     else content)
    with pytest.raises(NotACheckpointError, match=f'model.pth is not a checkpoint: {says}'):
        safe_load(str(path))
    with pytest.raises(NotACheckpointError):  # and through mmengine, as the tools load
        load_checkpoint(nn.Linear(2, 2), str(path))
    # both torch.save formats still load
    for zipped in (True, False):
        torch.save({'w': torch.ones(2)}, path, _use_new_zipfile_serialization=zipped)
        assert torch.equal(safe_load(str(path))['w'], torch.ones(2))
