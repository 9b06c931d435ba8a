"""Attention rollout and channel gates (mmrobust.analysis.attention) and their tool."""
import json

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope

from mmrobust.analysis import AttentionRecorder, attention_probs, rollout
from mmrobust.models import DrViT, FANHybrid
from mmrobust.models.backbones.drvit import Attention as ViTAttention
from mmrobust.models.backbones.fan import TokenMixing

from helpers import REPO, run_tool


@pytest.mark.parametrize('module', [TokenMixing(48, 3), ViTAttention(48, 3)],
                         ids=['fan', 'vit'])
def test_attention_probs_reproduce_the_module_output(module):
    torch.manual_seed(0)
    x = torch.randn(2, 10, 48)
    probs = attention_probs(module, x)
    assert probs.shape == (2, 3, 10, 10)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3, 10))
    # recomputing the output from these weights gives exactly what the fused SDPA gives
    if isinstance(module, TokenMixing):
        v = module.kv(x)[..., 48:]
    else:
        v = module.qkv(x)[..., 96:]
    v = v.reshape(2, 10, 3, 16).transpose(1, 2)
    out = module.proj((probs @ v).transpose(1, 2).reshape(2, 10, 48))
    torch.testing.assert_close(out, module(x), rtol=1e-4, atol=1e-5)


def test_rollout_rows_sum_to_one_and_identity_is_neutral():
    attn = [torch.rand(2, 4, 6, 6).softmax(-1) for _ in range(3)]
    roll = rollout(attn)
    torch.testing.assert_close(roll.sum(-1), torch.ones(2, 6))
    eye = torch.eye(6).expand(2, 4, 6, 6)
    torch.testing.assert_close(rollout([eye, eye]), torch.eye(6).expand(2, 6, 6))
    with pytest.raises(ValueError, match='no attention'):
        rollout([])


@pytest.mark.parametrize('backbone', ['fan', 'drvit'])
def test_recorder_maps_cover_the_token_grid(backbone):
    torch.manual_seed(0)
    if backbone == 'fan':
        model = FANHybrid(arch='tiny', out_type='det').eval()
        blocks = len(model.blocks)
    else:
        model = DrViT(arch='tiny', token_mode='pixel').eval()
        blocks = len(model.blocks)
    recorder = AttentionRecorder(model)
    with recorder.record():
        model(torch.randn(1, 3, 97, 161))
    assert len(recorder.attentions) == blocks
    maps = recorder.maps()
    assert maps.shape == ((1, 7, 11) if backbone == 'fan' else (1, 8, 12))
    torch.testing.assert_close(maps.sum((1, 2)), torch.ones(1))
    gates = recorder.gate_matrix()
    if backbone == 'fan':
        assert gates.shape == (1, blocks, model.blocks[0].attn.q.out_features)
        assert (gates >= 0).all()
    else:
        assert gates.numel() == 0
    with pytest.raises(TypeError, match='no FAN-Hybrid or Dr-ViT'):
        AttentionRecorder(torch.nn.Linear(2, 2))


@pytest.mark.slow
def test_attention_tool_on_a_toy_fan_detector(toy_data, tmp_path):
    config = 'configs/toy/mask-rcnn_fan-t-hybrid_fpn_toy-coco.py'
    cfg = Config.fromfile(str(REPO / config))
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model)
    ckpt = tmp_path / 'fan.pth'
    torch.save({'state_dict': model.state_dict()}, ckpt)
    out = tmp_path / 'attn'
    proc = run_tool('analysis_tools/attention_maps.py', config, ckpt, '--num-images', '1',
                    '--corruptions', 'fog', '--out-dir', out)
    assert 'rollout L1' in proc.stdout
    report = json.loads((out / 'attention.json').read_text())
    entry = next(iter(report['images'].values()))
    assert entry['clean']['rollout_l1_to_clean'] == 0 and entry['fog']['rollout_l1_to_clean'] > 0
    assert 'gate_l1_to_clean' in entry['fog']
    assert len(list(out.glob('gates_*.png'))) == 1 and len(list(out.glob('0*.png'))) == 1
