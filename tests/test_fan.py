"""FAN-Hybrid and FAN-Swin: the spec's parameter counts, dense outputs, knobs and checkpoints."""
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from mmrobust.models.backbones import FANHybrid, FANSwin
from mmrobust.models.backbones import fan as fan_module
from mmrobust.models.backbones import fan_swin as fan_swin_module
from mmrobust.models.checkpoint import CheckpointMismatchError, load_state_dict_strict
from mmrobust.models.layers import ChannelProcessing, fourier_features

# upstream state_dict layouts ([key, shape, dtype]), copied from the project's FAN spec
KEYS_DIR = Path(__file__).resolve().parent / 'data' / 'fan_keys'

# with the 1000-class head / without head (spec table)
CLS_PARAMS = {
    ('FANHybrid', 'tiny'): (7_467_240, 7_274_240),
    ('FANHybrid', 'small'): (26_117_944, 25_732_944),
    ('FANHybrid', 'base'): (50_475_048, 50_026_048),
    ('FANHybrid', 'large'): (76_855_140, 76_374_140),
    ('FANSwin', 'tiny'): (29_538_940, 28_769_940),
    ('FANSwin', 'small'): (53_064_220, 52_295_220),
    ('FANSwin', 'base'): (93_599_448, 92_574_448),
    ('FANSwin', 'large'): (208_941_136, 207_404_136),
}
# dense FAN-Hybrid backbones (no head, no final norm): seg / det
DENSE_PARAMS = {'tiny': (7_273_856, 8_601_728), 'small': (25_732_176, 28_387_152),
                'base': (50_025_152, 53_122_496), 'large': (76_373_180, 79_691_708)}
VARIANTS = sorted(CLS_PARAMS)
FAMILIES = {'FANHybrid': FANHybrid, 'FANSwin': FANSwin}


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _build(family: str, arch: str, **kwargs) -> nn.Module:
    model = FAMILIES[family](arch=arch, **kwargs)
    model.init_weights()
    return model


def _keys(name: str):
    return json.loads((KEYS_DIR / f'{name}.keys.json').read_text())


def _state_from_keys(name: str):
    g = torch.Generator().manual_seed(0)
    return {k: (torch.randn(shape, generator=g) if dtype == 'float32'
                else torch.zeros(shape, dtype=torch.int64)) for k, shape, dtype in _keys(name)}


# -- sizes -----------------------------------------------------------------------------------------
@pytest.mark.parametrize('family,arch', VARIANTS)
def test_parameter_counts_match_the_released_code(family, arch):
    # NOTE: the released code's counts (its model files built), which differ slightly from the
    # README's rounded table (FAN-S-Hybrid: 26.3M listed, 26.12M built)
    with torch.device('meta'):
        cls_model = FAMILIES[family](arch=arch, out_type='cls')
    with_head, without_head = CLS_PARAMS[(family, arch)]
    assert _count(cls_model) == with_head
    assert _count(cls_model) - _count(cls_model.head) == without_head
    if family == 'FANHybrid':
        with torch.device('meta'):
            seg = FANHybrid(arch=arch, out_type='seg')
            det = FANHybrid(arch=arch, out_type='det')
        assert (_count(seg), _count(det)) == DENSE_PARAMS[arch]
    else:
        with torch.device('meta'):
            dense = FANSwin(arch=arch)
        per_output_norms = sum(2 * dense.feature_info[i]['num_chs'] for i in range(4))
        assert _count(dense) == without_head - _count(cls_model.norm) + per_output_norms


@pytest.mark.parametrize('family,arch', VARIANTS)
@pytest.mark.parametrize('size', [(64, 64), (97, 161)], ids=['64x64', '97x161'])
def test_dense_outputs_any_size(family, arch, size):
    kwargs = [dict(out_type='det'), dict(out_type='seg')] if family == 'FANHybrid' else [{}]
    for kw in kwargs:
        model = _build(family, arch, **kw).eval()
        with torch.no_grad():
            outs = model(torch.randn(1, 3, *size))
        assert len(outs) == 4
        for out, info in zip(outs, model.feature_info):
            r = info['reduction']
            assert out.shape == (1, info['num_chs'], math.ceil(size[0] / r),
                                 math.ceil(size[1] / r))
            assert torch.isfinite(out).all()
            assert out.is_contiguous()  # see test_detector_roi_features_read_the_right_pixels
        if family == 'FANHybrid':
            strides = [i['reduction'] for i in model.feature_info]
            assert strides == ([4, 8, 16, 32] if kw['out_type'] == 'det' else [4, 8, 16, 16])
        else:
            assert [i['reduction'] for i in model.feature_info] == [4, 8, 16, 32]


@pytest.mark.parametrize('family', FAMILIES)
def test_detector_roi_features_read_the_right_pixels(family):
    # mmcv 2.1's RoIAlign reads its input as contiguous NCHW whatever its strides, and an FPN
    # passes a channels-last layout on: the backbone maps must reach it contiguous
    from mmcv.ops import RoIAlign
    from mmdet.models.necks import FPN
    model = _build(family, 'tiny').eval()
    fpn = FPN([i['num_chs'] for i in model.feature_info], 32, 4,
              norm_cfg=dict(type='GN', num_groups=8)).eval()
    roi_align = RoIAlign(7, 1 / 4, 2)
    rois = torch.tensor([[0, 10., 12., 70., 50.], [0, 40., 5., 90., 60.]])
    with torch.no_grad():
        p2 = fpn(model(torch.randn(1, 3, 97, 161)))[0]
        assert torch.equal(roi_align(p2, rois), roi_align(p2.contiguous(), rois))
    scrambled = p2.contiguous(memory_format=torch.channels_last)
    assert not torch.allclose(roi_align(scrambled, rois), roi_align(p2, rois))  # the trap


def test_upstream_shapes_at_512_for_tiny():
    det = _build('FANHybrid', 'tiny', out_type='det').eval()
    with torch.no_grad():
        shapes = [tuple(o.shape[1:]) for o in det(torch.randn(1, 3, 512, 512))]
    assert shapes == [(128, 128, 128), (256, 64, 64), (192, 32, 32), (768, 16, 16)]


@pytest.mark.parametrize('family', FAMILIES)
def test_out_indices(family):
    model = _build(family, 'tiny', out_indices=(1, 3)).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 64))
    assert [o.shape[1] for o in outs] == [model.feature_info[1]['num_chs'],
                                          model.feature_info[3]['num_chs']]


# -- training knobs --------------------------------------------------------------------------------
@pytest.mark.parametrize('family,kw', [('FANHybrid', dict(out_type='det')),
                                       ('FANHybrid', dict(out_type='seg')), ('FANSwin', {})])
def test_every_parameter_gets_a_gradient(family, kw):
    model = _build(family, 'tiny', **kw).train()
    outs = model(torch.randn(2, 3, 64, 96))
    sum(o.square().mean() for o in outs).backward()
    no_grad = [n for n, p in model.named_parameters()
               if p.requires_grad and (p.grad is None or not p.grad.abs().sum())]
    assert not no_grad
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    if family == 'FANHybrid':
        # only what the class token alone uses is frozen in the dense forms
        assert frozen and all(n == 'cls_token' or '.attn.' in n or '.mlp.' in n or
                              n.endswith('gamma2') for n in frozen)
        assert all(n.startswith(('cls_token', 'cls_attn_blocks.')) for n in frozen)
    else:
        assert not frozen


@pytest.mark.parametrize('family', FAMILIES)
def test_zero_padding_keeps_gradients_well_conditioned(family):
    # detectors pad batches with zeros (after normalisation); from scratch, that must not turn
    # the patch-embedding LayerNorm into a 1/sqrt(eps) gradient amplifier
    torch.manual_seed(0)
    model = _build(family, 'tiny').train()
    x = torch.randn(2, 3, 64, 96)

    def grad_norm(inputs: torch.Tensor) -> float:
        model.zero_grad()
        sum(o.square().mean() for o in model(inputs)).backward()
        return torch.stack([p.grad.norm() for p in model.parameters()
                            if p.grad is not None]).norm().item()

    padded = x.clone()
    padded[..., 48:] = 0  # half the batch area is padding
    assert grad_norm(padded) < 10 * grad_norm(x)


def test_dense_patch_tokens_equal_the_full_class_attention_path():
    torch.manual_seed(0)
    cls_model = _build('FANHybrid', 'tiny', out_type='cls').eval()
    seg = FANHybrid('tiny', out_type='seg', out_indices=(3,)).eval()
    seg.load_state_dict({k: v for k, v in cls_model.state_dict().items()
                         if not k.startswith(('head.', 'norm.'))})
    for blk in cls_model.cls_attn_blocks:  # non-trivial layer scales
        nn.init.normal_(blk.gamma1, 1, 0.2)
        nn.init.normal_(blk.gamma2, 1, 0.2)
    seg.load_state_dict({k: v for k, v in cls_model.state_dict().items()
                         if not k.startswith(('head.', 'norm.'))})
    x = torch.randn(1, 3, 64, 80)
    captured = {}
    cls_model.cls_attn_blocks[-1].register_forward_hook(
        lambda m, i, o: captured.setdefault('tokens', o))
    with torch.no_grad():
        cls_model(x)
        dense = seg(x)[0]
    full = captured['tokens'][:, 1:].transpose(1, 2).reshape(dense.shape)
    torch.testing.assert_close(dense, full)


@pytest.mark.parametrize('family', FAMILIES)
def test_with_cp_gives_the_same_outputs_and_grads(family):
    torch.manual_seed(0)
    plain = _build(family, 'tiny').train()
    ckpt = _build(family, 'tiny', with_cp=True).train()
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 64, 64)
    outs_a, outs_b = plain(x), ckpt(x)
    for a, b in zip(outs_a, outs_b):
        torch.testing.assert_close(a, b)
    sum(o.sum() for o in outs_a).backward()
    sum(o.sum() for o in outs_b).backward()
    for (name, pa), pb in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, msg=name)


@pytest.mark.parametrize('family', FAMILIES)
@pytest.mark.parametrize('frozen', [0, 2])
def test_frozen_stages(family, frozen):
    model = _build(family, 'tiny', frozen_stages=frozen).train()
    if family == 'FANHybrid':
        convnext = model.patch_embed.backbone
        frozen_mods = [convnext.stem, convnext.stages[0], convnext.stages[1]][:frozen + 1]
        trainable = [model.blocks, model.learnable_downsample]
    else:
        frozen_mods = [model.patch_embed, model.layers[0], model.layers[1]][:frozen + 1]
        trainable = [model.layers[2], model.layers[3]]
    for m in frozen_mods:
        assert all(not p.requires_grad for p in m.parameters())
        assert not any(sub.training for sub in m.modules())
    for m in trainable:
        assert all(p.requires_grad for p in m.parameters())
        assert all(sub.training for sub in m.modules())
    if frozen == 2 and family == 'FANHybrid':
        # the frozen ConvNeXt output does not change when the model trains on a batch
        x = torch.randn(2, 3, 64, 64)
        before = model(x)[0].detach()
        assert torch.equal(before, model(x)[0].detach())


@pytest.mark.parametrize('family', FAMILIES)
def test_norm_eval_keeps_batchnorm_statistics(family):
    model = _build(family, 'tiny', norm_eval=True).train()
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and not any(bn.training for bn in bns)
    before = [bn.running_mean.clone() for bn in bns]
    model(torch.randn(2, 3, 64, 64))
    assert all(torch.equal(b, bn.running_mean) for b, bn in zip(before, bns))


@pytest.mark.parametrize('family', FAMILIES)
def test_drop_path_is_applied(family):
    model = _build(family, 'tiny', drop_path_rate=0.5)
    x = torch.randn(2, 3, 64, 64)
    model.train()
    torch.manual_seed(0)
    a = model(x)[2]
    torch.manual_seed(1)
    b = model(x)[2]
    assert not torch.allclose(a, b)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x)[2], model(x)[2])


def test_drop_path_schedules():
    const = FANHybrid('tiny', drop_path_rate=0.2)
    ramp = FANHybrid('tiny', drop_path_rate=0.2, drop_path_schedule='linear')
    assert [b.drop_path.drop_prob for b in const.blocks] == [0.2] * 8
    probs = [getattr(b.drop_path, 'drop_prob', 0.) for b in ramp.blocks]
    assert probs[0] == 0 and probs[-1] == pytest.approx(0.2) and probs == sorted(probs)


def test_bad_arguments_are_explained():
    with pytest.raises(KeyError, match="choose from"):
        FANHybrid('tiiny')
    with pytest.raises(KeyError, match='exactly the keys'):
        FANHybrid(dict(embed_dims=64, depth=2))
    with pytest.raises(ValueError, match='out_type'):
        FANHybrid('tiny', out_type='dense')
    custom = FANHybrid(dict(embed_dims=64, depth=2, num_heads=4, convnext_depths=(1, 1),
                            out_block=1), out_type='seg')
    assert custom.arch_name == 'custom' and len(custom.blocks) == 2


# -- maths -----------------------------------------------------------------------------------------
def test_channel_processing_matches_the_definition():
    torch.manual_seed(0)
    cp = ChannelProcessing(dim=8, num_heads=2).eval()
    nn.init.uniform_(cp.temperature, 0.5, 1.5)
    h, w = 3, 4
    x = torch.randn(2, h * w, 8)
    out = cp(x, h, w)
    v = cp.norm_v(cp.mlp_v(x, h, w))
    q = cp.q(x)
    expected = torch.empty_like(out)
    for b in range(2):
        for head in range(2):
            sl = slice(4 * head, 4 * head + 4)
            q_hat = q[b, :, sl].softmax(dim=0)  # softmax over tokens
            k_bar = x[b, :, sl].softmax(dim=0).mean(dim=1)  # mean-pooled prototype per token
            gate = torch.sigmoid(q_hat.T @ k_bar) * cp.temperature[head, 0, 0]
            expected[b, :, sl] = v[b, :, sl] * gate
    torch.testing.assert_close(out, expected)


def test_fourier_features_formula_and_legacy_flag():
    h, w = 3, 5
    feats = fourier_features(h, w)
    assert feats.shape == (1, 64, h, w)
    i, j, k = 1, 3, 5  # y feature k=5 (odd -> cos), frequency 10000^(2*2/32)
    y = (i + 1) / (h + 1e-6) * 2 * math.pi
    assert feats[0, k, i, j].item() == pytest.approx(math.cos(y / 10000 ** (4 / 32)), abs=1e-5)
    x = (j + 1) / (w + 1e-6) * 2 * math.pi
    assert feats[0, 32 + 4, i, j].item() == pytest.approx(math.sin(x / 10000 ** (4 / 32)),
                                                          abs=1e-5)
    legacy = fourier_features(h, w, legacy=True)
    assert legacy[0, k, i, j].item() == pytest.approx(math.cos(y / 10000 ** (5 / 32)), abs=1e-5)
    assert (legacy - feats).abs().max() > 0.1


# -- checkpoints -----------------------------------------------------------------------------------
CLS_KEY_FILES = {'tiny': 'fan_hybrid_tiny_cls', 'small': 'fan_hybrid_small',
                 'base': 'fan_hybrid_base', 'large': 'fan_hybrid_large'}


@pytest.mark.parametrize('arch', sorted(CLS_KEY_FILES))
@pytest.mark.parametrize('out_type', ['cls', 'seg', 'det'])
def test_upstream_hybrid_key_layout_loads(arch, out_type):
    with torch.device('meta'):
        model = FANHybrid(arch, out_type=out_type)
    keys = _keys(CLS_KEY_FILES[arch])
    state = {k: torch.empty(shape, device='meta') for k, shape, _ in keys}
    reported = {}
    converted = fan_module.checkpoint_filter_fn({'state_dict': state}, model, reported)
    allowed = ('learnable_downsample.',) if out_type == 'det' else ()
    load_state_dict_strict(model, converted, allowed)
    own = model.state_dict()
    dropped = set(state) - set(converted)
    assert dropped == (set() if out_type == 'cls' else {'head.weight', 'head.bias',
                                                        'norm.weight', 'norm.bias'})
    assert set(reported) == dropped and all('classifier' in r for r in reported.values())
    assert set(own) - set(converted) == ({'learnable_downsample.weight',
                                          'learnable_downsample.bias'} if out_type == 'det'
                                         else set())


@pytest.mark.parametrize('name,out_type', [('fan_hybrid_tiny_seg', 'seg'),
                                           ('fan_hybrid_tiny_det', 'det')])
def test_upstream_dense_tiny_layouts_load_exactly(name, out_type):
    model = FANHybrid('tiny', out_type=out_type)
    state = _state_from_keys(name)
    load_state_dict_strict(model, fan_module.checkpoint_filter_fn(state, model))
    for k, v in state.items():
        assert torch.equal(model.state_dict()[k], v)


def test_upstream_swin_layout_loads_and_drops_buffers():
    model = FANSwin('tiny', out_type='cls')
    state = _state_from_keys('fan_swin_tiny_cls')
    converted = fan_swin_module.checkpoint_filter_fn({'model': state}, model)
    load_state_dict_strict(model, converted)
    assert not any(k.endswith(('attn_mask', 'relative_position_index')) for k in converted)
    dense = FANSwin('tiny')
    reported = {}
    load_state_dict_strict(dense, fan_swin_module.checkpoint_filter_fn(state, dense, reported),
                           allowed_missing=('norm0.', 'norm1.', 'norm2.', 'norm3.'))
    buffers = {k for k in state if k.endswith(('attn_mask', 'relative_position_index'))}
    assert buffers and set(reported) == buffers | {'head.weight', 'head.bias', 'norm.weight',
                                                   'norm.bias'}
    assert {reported[k] for k in buffers} == {
        'shift mask / position index, recomputed for the actual input'}


def test_pretrained_init_cfg_loads_wrapped_module_prefixed_checkpoint(tmp_path):
    source = _build('FANHybrid', 'tiny', out_type='cls')
    path = tmp_path / 'fan_hybrid_tiny.pth.tar'
    torch.save({'state_dict_ema': {f'module.{k}': v for k, v in source.state_dict().items()}},
               path)
    model = FANHybrid('tiny', out_type='det',
                      init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    for k, v in model.state_dict().items():
        if not k.startswith('learnable_downsample'):
            assert torch.equal(v, source.state_dict()[k]), k


def test_strict_loading_lists_bad_keys(tmp_path):
    model = FANHybrid('tiny', out_type='seg')
    state = dict(model.state_dict())
    state['blocks.0.attn.qq.weight'] = state.pop('blocks.0.attn.q.weight')
    del state['cls_attn_blocks.1.gamma2']
    with pytest.raises(CheckpointMismatchError) as info:
        load_state_dict_strict(model, fan_module.checkpoint_filter_fn(state, model))
    msg = str(info.value)
    assert 'blocks.0.attn.q.weight' in msg and 'blocks.0.attn.qq.weight' in msg
    assert 'cls_attn_blocks.1.gamma2' in msg
    # a checkpoint of another variant
    path = tmp_path / 'small.pth'
    torch.save(FANHybrid('small', out_type='seg').state_dict(), path)
    wrong = FANHybrid('tiny', out_type='seg', init_cfg=dict(type='Pretrained',
                                                            checkpoint=str(path)))
    with pytest.raises(CheckpointMismatchError, match='shape mismatches'):
        wrong.init_weights()


def test_in22k_384_checkpoints_load_into_224_models():
    # FAN-Hybrid: the Fourier encoding has no table, the 384 checkpoint's keys are the same
    hybrid = FANHybrid('tiny', out_type='seg')
    state = dict(FANHybrid('tiny', out_type='cls').state_dict())
    load_state_dict_strict(hybrid, fan_module.checkpoint_filter_fn(state, hybrid))
    # FAN-Swin: a relative position table trained with 12x12 windows is resampled to 7x7
    swin = FANSwin('tiny', out_type='cls')
    state = {k: v for k, v in swin.state_dict().items()}
    table = torch.randn(23 * 23, 3)
    state['layers.0.blocks.0.attn.relative_position_bias_table'] = table
    converted = fan_swin_module.checkpoint_filter_fn(state, swin)
    assert converted['layers.0.blocks.0.attn.relative_position_bias_table'].shape == (169, 3)
    load_state_dict_strict(swin, converted)


def test_missing_pretrained_file_says_what_to_do():
    model = FANHybrid('tiny', init_cfg=dict(type='Pretrained',
                                            checkpoint='checkpoints/nope.pth.tar'))
    with pytest.raises(FileNotFoundError, match=r"(?s)nope\.pth\.tar.*init_cfg=None"):
        model.init_weights()


@pytest.mark.slow
def test_converter_cli_writes_a_strictly_loadable_checkpoint(tmp_path):
    from helpers import run_tool
    src = tmp_path / 'fan_hybrid_tiny.pth.tar'
    torch.save({'state_dict': _state_from_keys('fan_hybrid_tiny_cls')}, src)
    dst = tmp_path / 'converted.pth'
    proc = run_tool('model_converters/fan2mmrobust.py', src, dst, '--arch', 'tiny')
    assert 'learnable_downsample.weight' in proc.stdout
    model = FANHybrid('tiny', out_type='det', init_cfg=dict(type='Pretrained',
                                                            checkpoint=str(dst)))
    model.init_weights()
    ref = _state_from_keys('fan_hybrid_tiny_cls')
    assert torch.equal(model.state_dict()['blocks.3.mlp.q.weight'], ref['blocks.3.mlp.q.weight'])
    # a checkpoint of another variant is refused with the mismatching keys listed
    proc = run_tool('model_converters/fan2mmrobust.py', src, dst, '--arch', 'small',
                    check=False)
    assert proc.returncode != 0 and 'shape mismatches' in proc.stderr


def test_stem_norms_reproduce_the_released_training():
    from mmrobust.models.layers import LayerNorm2d
    norm = LayerNorm2d(8, unbiased=True)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    x = torch.randn(2, 8, 3, 5)
    mean = x.mean(1, keepdim=True)
    var = ((x - mean) ** 2).sum(1, keepdim=True) / 7  # C - 1
    ref = (x - mean) / torch.sqrt(var + 1e-6) * norm.weight[:, None, None] + \
        norm.bias[:, None, None]
    torch.testing.assert_close(norm(x), ref)
    # the stem's first norm is biased, the 7 inner ones (T/S/B) unbiased
    model = FANHybrid('tiny')
    norms = [m for m in model.patch_embed.modules() if isinstance(m, LayerNorm2d)]
    assert [m.unbiased for m in norms] == [False] + [True] * 7
    assert not any(m.unbiased for m in FANHybrid('tiny', stem_unbiased_norm=False).modules()
                   if isinstance(m, LayerNorm2d))


def test_mmengine_flop_count_of_a_fan_block_includes_its_attention():
    """``get_flops.py`` (mmengine's FlopAnalyzer) counts the fused attention mmrobust registers.

    Heads x N x N x (q·k and attn·v widths) multiply-adds, mmengine's unit.
    """
    from mmengine.analysis import FlopAnalyzer

    import mmrobust  # noqa: F401  (registers the handle)
    dim, heads, side = 192, 4, 14
    block = fan_module.FANBlock(dim, heads).eval()
    analyzer = FlopAnalyzer(block, (torch.randn(1, side * side, dim), side, side))
    n = side * side
    assert analyzer.by_operator()['scaled_dot_product_attention'] == heads * n * n * 2 * (
        dim // heads)
    assert 'aten::scaled_dot_product_attention' not in analyzer.unsupported_ops()
    assert analyzer.total() > sum(v for k, v in analyzer.by_operator().items()
                                  if k != 'scaled_dot_product_attention')
