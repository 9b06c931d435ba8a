"""Whole-model checkpoints load strictly: in the Runner (hook), the tools and ``init_model``."""
import logging
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.model import BaseModel, BaseTTAModel
from mmengine.runner import Runner

from mmrobust.apis import init_model, load_checkpoint_strict
from mmrobust.engine import StrictLoadHook
from mmrobust.models.checkpoint import CheckpointMismatchError
from mmrobust.utils import safe_load

from helpers import REPO, assert_user_error, run_cmd

FAN_T_CFG = 'configs/toy/mask-rcnn_fan-t-hybrid_fpn_toy-coco.py'
AS_FAN_S = 'model.backbone.arch=small'  # the same config, the next variant up


class Net(nn.Module):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3)
        self.norm = nn.BatchNorm2d(width)

    def test_step(self, data):  # what BaseTTAModel asks of its module
        return data


class TTA(BaseTTAModel):
    def merge_preds(self, data_samples_list):
        return data_samples_list


def fake_runner(model: nn.Module) -> SimpleNamespace:
    return SimpleNamespace(model=model, logger=MMLogger.get_current_instance())


def test_hook_passes_a_matching_checkpoint_with_ddp_prefixes(caplog):
    model = Net()
    state = {f'module.{k}': v for k, v in model.state_dict().items()}
    runner = fake_runner(model)
    runner.logger = logging.getLogger('strict-load-match')
    with caplog.at_level(logging.INFO, logger='strict-load-match'):
        StrictLoadHook().after_load_checkpoint(runner, {'state_dict': state})
        # the TTA wrapper loads into its module, as mmengine does
        runner.model = TTA(module=Net())
        StrictLoadHook().after_load_checkpoint(runner, {'state_dict': model.state_dict()})
    assert caplog.text.count(f'checkpoint matches Net: all {len(state)} tensors') == 2


def test_hook_stops_with_the_lists():
    state = Net(width=8).state_dict()
    state['extra.weight'] = torch.zeros(1)
    del state['norm.running_var']
    with pytest.raises(CheckpointMismatchError) as err:
        StrictLoadHook().after_load_checkpoint(fake_runner(Net()), {'state_dict': state})
    message = str(err.value)
    assert 'missing keys (1): norm.running_var' in message
    assert 'unexpected keys (1): extra.weight' in message
    assert 'conv.weight: checkpoint (8, 3, 3, 3) vs model (4, 3, 3, 3)' in message
    assert '--allow-partial-load' in message


def test_hook_opt_out_logs_the_lists(caplog):
    runner = fake_runner(Net())
    runner.logger = logging.getLogger('strict-load-test')
    with caplog.at_level(logging.WARNING, logger='strict-load-test'):
        StrictLoadHook(allow_partial=True).after_load_checkpoint(
            runner, {'state_dict': Net(width=8).state_dict()})
    assert 'PARTIAL LOAD' in caplog.text and 'shape mismatches (' in caplog.text


def test_hook_refuses_what_is_no_checkpoint():
    with pytest.raises(CheckpointMismatchError, match='not a checkpoint'):
        StrictLoadHook().after_load_checkpoint(fake_runner(Net()), [1, 2])


@pytest.fixture(scope='module')
def fan_t_checkpoint(tmp_path_factory, toy_data):
    """A whole-model checkpoint of the toy FAN-T-Hybrid Mask R-CNN (untrained weights)."""
    model = init_model(str(REPO / FAN_T_CFG))
    path = tmp_path_factory.mktemp('strict') / 'fan_t.pth'
    torch.save({'state_dict': model.state_dict(),
                'meta': {'dataset_meta': {'classes': ('a', 'b', 'c', 'd', 'e')}}}, path)
    return path


def test_init_model_is_strict(fan_t_checkpoint, in_repo):
    from mmengine.config import Config
    model = init_model(FAN_T_CFG, str(fan_t_checkpoint))
    saved = torch.load(fan_t_checkpoint, weights_only=True)['state_dict']
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    assert model.dataset_meta['classes'] == ('a', 'b', 'c', 'd', 'e')
    cfg = Config.fromfile(FAN_T_CFG)
    cfg.model.backbone.arch = 'small'
    with pytest.raises(CheckpointMismatchError, match=r'missing keys \(\d+\).*shape mismatches'):
        init_model(cfg, str(fan_t_checkpoint))
    model = init_model(cfg, str(fan_t_checkpoint), allow_partial_load=True)
    assert torch.equal(model.rpn_head.rpn_cls.weight, saved['rpn_head.rpn_cls.weight'])
    with pytest.raises(CheckpointMismatchError):
        load_checkpoint_strict(model, str(fan_t_checkpoint))


@pytest.mark.parametrize('tool', ['test.py', 'test_robustness.py',
                                  'analysis_tools/attention_maps.py', 'train.py'])
def test_tools_stop_on_a_checkpoint_of_another_variant(tool, fan_t_checkpoint, tmp_path):
    """A FAN-T checkpoint given to FAN-S: every tool stops with the key lists, exit 1."""
    if tool == 'train.py':  # `load_from` goes through the same Runner load
        args = [FAN_T_CFG, '--work-dir', tmp_path, '--cfg-options', AS_FAN_S,
                f'load_from={fan_t_checkpoint}', 'train_cfg.max_iters=1']
    elif tool == 'analysis_tools/attention_maps.py':
        args = [FAN_T_CFG, fan_t_checkpoint, '--out-dir', tmp_path, '--num-images', '1',
                '--cfg-options', AS_FAN_S]
    else:
        args = [FAN_T_CFG, fan_t_checkpoint, '--work-dir', tmp_path, '--cfg-options', AS_FAN_S]
    proc = run_cmd([sys.executable, REPO / 'tools' / tool, *args], check=False)
    # a message, not a crash: one error: line with the key lists, exit status 1, no traceback
    assert_user_error(proc.returncode, proc.stderr, 1, 'shape mismatches (', 'missing keys (')
    assert not list(tmp_path.rglob('*.json')) or tool == 'train.py'  # no results written


# -- in a real Runner: a DDP wrapper, EMA and resume -----------------------------------------------

class TinyModel(BaseModel):
    """conv, BN, pool, linear: a model the Runner trains in a second."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(3, width, 3), nn.BatchNorm2d(width)
        self.head = nn.Linear(width, 1)

    def forward(self, inputs, data_samples=None, mode: str = 'tensor'):
        y = self.head(self.norm(self.conv(inputs)).mean((2, 3)))
        return {'loss': (y ** 2).mean()} if mode == 'loss' else y


class TinyData(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        return {'inputs': torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(i))}


def _runner(work_dir, width: int = 4, iters: int = 2, ema_priority='NORMAL', **kwargs) -> Runner:
    """A Runner with mmengine's DDP wrapper (a 1-process gloo group), EMAHook and the check."""
    return Runner(
        model=TinyModel(width), work_dir=str(work_dir), launcher='pytorch',
        cfg=dict(model_wrapper_cfg=dict(type='MMDistributedDataParallel', device_ids=None,
                                        broadcast_buffers=False)),
        train_dataloader=dict(dataset=TinyData(), batch_size=2, num_workers=0,
                              sampler=dict(type='DefaultSampler', shuffle=False),
                              collate_fn=dict(type='default_collate')),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1, by_epoch=False),
                           logger=dict(type='LoggerHook', interval=1)),
        custom_hooks=[dict(type='EMAHook', priority=ema_priority), StrictLoadHook()],
        default_scope='mmdet',  # NOTE: the scope the other tests in this process expect
        experiment_name=f'strict-{width}-{iters}-{work_dir.name}', **kwargs)


@pytest.fixture
def one_process_group(monkeypatch):
    import torch.distributed as dist

    from helpers import free_port
    for key, value in (('RANK', '0'), ('LOCAL_RANK', '0'), ('WORLD_SIZE', '1')):
        monkeypatch.setenv(key, value)
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{free_port()}', rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize('ema_priority', ['NORMAL', 49], ids=['ema-normal', 'ema-mmdet'])
def test_runner_resume_with_ddp_and_ema_loads_strictly(ema_priority, tmp_path, one_process_group):
    """A checkpoint of a DDP-wrapped model with EMA resumes through the check.

    The EMA hook swaps its weights back first. Another width stops the resume and a ``load_from``
    with the lists, before training starts and before the EMA hook (at mmengine's priority or
    mmdet's 49) meets the mismatch itself.
    """
    from mmengine.model import MMDistributedDataParallel
    first = _runner(tmp_path / 'a', ema_priority=ema_priority)
    assert isinstance(first.model, MMDistributedDataParallel)
    first.train()
    saved = str(tmp_path / 'a' / 'iter_2.pth')
    ckpt = safe_load(saved)
    assert 'ema_state_dict' in ckpt  # the EMA hook took part in saving

    resumed = _runner(tmp_path / 'b', iters=3, ema_priority=ema_priority, resume=True,
                      load_from=saved)
    resumed.train()
    hook = next(h for h in resumed.hooks if isinstance(h, StrictLoadHook))
    assert hook.last_load == {'matched': len(ckpt['state_dict']), 'missing': [],
                              'unexpected': [], 'errors': []}
    assert resumed.iter == 3

    for options in (dict(resume=True), {}):
        wider = _runner(tmp_path / f'c{len(options)}', width=8, ema_priority=ema_priority,
                        load_from=saved, **options)
        before = {k: v.clone() for k, v in wider.model.module.state_dict().items()}
        with pytest.raises(CheckpointMismatchError, match=r'norm.weight: checkpoint \(4\) vs '
                                                          r'model \(8\)'):
            wider.train()
        assert wider.iter == 0  # stopped at the load, not after training
        assert all(torch.equal(v, wider.model.module.state_dict()[k])
                   for k, v in before.items())  # nothing was copied
