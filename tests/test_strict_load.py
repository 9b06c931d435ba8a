"""Whole-model checkpoints load strictly: in the Runner (hook), the tools and `init_model`."""
import logging
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.model import BaseTTAModel

from mmrobust.apis import init_model, load_checkpoint_strict
from mmrobust.engine import StrictLoadHook
from mmrobust.models.utils import CheckpointMismatchError

from conftest import REPO, run_cmd

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
    """A FAN-T checkpoint given to FAN-S: every tool stops with the key lists, exit != 0."""
    if tool == 'train.py':  # `load_from` goes through the same Runner load
        args = [FAN_T_CFG, '--work-dir', tmp_path, '--cfg-options', AS_FAN_S,
                f'load_from={fan_t_checkpoint}', 'train_cfg.max_iters=1']
    elif tool == 'analysis_tools/attention_maps.py':
        args = [FAN_T_CFG, fan_t_checkpoint, '--out-dir', tmp_path, '--num-images', '1',
                '--cfg-options', AS_FAN_S]
    else:
        args = [FAN_T_CFG, fan_t_checkpoint, '--work-dir', tmp_path, '--cfg-options', AS_FAN_S]
    proc = run_cmd([sys.executable, REPO / 'tools' / tool, *args], check=False)
    assert proc.returncode != 0
    assert 'CheckpointMismatchError' in proc.stderr
    assert 'shape mismatches (' in proc.stderr and 'missing keys (' in proc.stderr
    assert not list(tmp_path.rglob('*.json')) or tool == 'train.py'  # no results written
