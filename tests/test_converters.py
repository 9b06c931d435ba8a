"""Converters from the weights users have to the checkpoints the configs load.

tools/model_converters/convert_backbone.py, mmrobust/apis/convert.py. And the checkpoint filters
behind them.

The upstream key layouts are files under tests/data/: timm's ``tf_efficientnet_lite0`` state dict
(names, shapes, dtypes dumped from timm 1.0.31) and the TensorFlow variables of the official
EfficientNet-Lite0 release, written from its naming (``blocks_K/conv2d``,
``tpu_batch_normalization_N``, HWIO kernels) for the same tensors.
"""
import json
import os.path as osp
import re

import numpy as np
import pytest
import torch

from mmrobust.apis.convert import convert_checkpoint
from mmrobust.models.backbones.efficientnet_lite import EfficientNetLite, checkpoint_filter_fn
from mmrobust.models.checkpoint import CheckpointMismatchError, load_state_dict_strict

from helpers import REPO, run_tool_here

KEYS = REPO / 'tests' / 'data' / 'efficientnet_keys'


def _layout(name: str):
    return json.loads((KEYS / f'{name}.keys.json').read_text())


def _timm_state(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return {k: (torch.randn(shape, generator=g) if dtype == 'float32' else torch.tensor(7))
            for k, shape, dtype in _layout('timm_tf_efficientnet_lite0')}


def _tf_from_timm(state):
    """The TF release's variables holding the same weights as a timm state dict.

    The mapping of configs/efficientdet/README.md, written out independently of the converter.
    """
    out = {}
    blocks = sorted({tuple(map(int, m.groups())) for k in state
                     if (m := re.match(r'blocks\.(\d+)\.(\d+)\.', k))})
    P = 'efficientnet-lite0/'

    def conv(name, w):
        if w.shape[1] == 1 and w.shape[0] > 1:  # depthwise: (C, 1, kh, kw) -> (kh, kw, C, 1)
            out[P + name + '/depthwise_kernel'] = w.permute(2, 3, 0, 1).numpy()
        else:  # (O, I, kh, kw) -> (kh, kw, I, O)
            out[P + name + '/kernel'] = w.permute(2, 3, 1, 0).numpy()

    def bn(name, prefix):
        for tf, pt in (('gamma', 'weight'), ('beta', 'bias'), ('moving_mean', 'running_mean'),
                       ('moving_variance', 'running_var')):
            out[P + name + '/' + tf] = state[prefix + pt].numpy()

    conv('stem/conv2d', state['conv_stem.weight'])
    bn('stem/tpu_batch_normalization', 'bn1.')
    for i, (s, j) in enumerate(blocks):
        b, q = f'blocks.{s}.{j}.', f'blocks_{i}/'
        if b + 'conv_pwl.weight' in state:
            order = [('conv_pw', 'conv2d'), ('bn1', 'tpu_batch_normalization'),
                     ('conv_dw', 'depthwise_conv2d'), ('bn2', 'tpu_batch_normalization_1'),
                     ('conv_pwl', 'conv2d_1'), ('bn3', 'tpu_batch_normalization_2')]
        else:
            order = [('conv_dw', 'depthwise_conv2d'), ('bn1', 'tpu_batch_normalization'),
                     ('conv_pw', 'conv2d'), ('bn2', 'tpu_batch_normalization_1')]
        for timm, tf in order:
            if timm.startswith('conv'):
                conv(q + tf, state[b + timm + '.weight'])
            else:
                bn(q + tf, b + timm + '.')
    conv('head/conv2d', state['conv_head.weight'])
    bn('head/tpu_batch_normalization', 'bn2.')
    out[P + 'head/dense/kernel'] = state['classifier.weight'].t().numpy()
    out[P + 'head/dense/bias'] = state['classifier.bias'].numpy()
    return out


def _keras_from_tf(tf, timm):
    """TF-Keras names (block{stage}{letter}_...) for the same variables."""
    blocks = sorted({tuple(map(int, m.groups())) for k in timm
                     if (m := re.match(r'blocks\.(\d+)\.(\d+)\.', k))})
    out = {}
    for key, value in tf.items():
        name = key[len('efficientnet-lite0/'):]
        if m := re.match(r'blocks_(\d+)/(\w+)/(\w+)', name):
            s, j = blocks[int(m[1])]
            inverted = any(k.endswith(f'/blocks_{m[1]}/conv2d_1/kernel') for k in tf)
            roles = ({'conv2d': 'expand_conv', 'tpu_batch_normalization': 'expand_bn',
                      'depthwise_conv2d': 'dwconv', 'tpu_batch_normalization_1': 'bn',
                      'conv2d_1': 'project_conv', 'tpu_batch_normalization_2': 'project_bn'}
                     if inverted else
                     {'depthwise_conv2d': 'dwconv', 'tpu_batch_normalization': 'bn',
                      'conv2d': 'project_conv', 'tpu_batch_normalization_1': 'project_bn'})
            name = f'block{s + 1}{chr(97 + j)}_{roles[m[2]]}/{m[3]}'
        else:
            name = {'stem/conv2d': 'stem_conv', 'stem/tpu_batch_normalization': 'stem_bn',
                    'head/conv2d': 'top_conv', 'head/tpu_batch_normalization': 'top_bn',
                    'head/dense': 'predictions'}[name.rsplit('/', 1)[0]] + '/' + \
                name.rsplit('/', 1)[1]
        out[name + ':0'] = value
    return out


def _trained_like_state(seed: int = 0):
    """A timm state dict whose forward stays finite through 16 blocks.

    He-scaled convolutions and BN statistics of a trained model's order (variances ~1e-3..1e-1,
    where TF's BN epsilon of 1e-3 differs visibly from torch's 1e-5).
    """
    g = torch.Generator().manual_seed(seed)
    state = {}
    for k, shape, dtype in _layout('timm_tf_efficientnet_lite0'):
        if dtype != 'float32':
            state[k] = torch.tensor(7)
        elif k.endswith('running_var'):
            state[k] = 10 ** (-3 + 2 * torch.rand(shape, generator=g))
        elif k.endswith('running_mean') or k.endswith('bias'):
            state[k] = 0.1 * torch.randn(shape, generator=g)
        elif len(shape) == 4:
            fan_in = shape[1] * shape[2] * shape[3]
            state[k] = torch.randn(shape, generator=g) * (2 / fan_in) ** 0.5 * 0.05
        else:
            state[k] = 1 + 0.1 * torch.randn(shape, generator=g)
    return state


# timm's tf_efficientnet_lite0 (arch ds_r1_k3_s1_e1_c16, ir_r2_k3_s2_e6_c24, ir_r2_k5_s2_e6_c40,
# ir_r3_k3_s2_e6_c80, ir_r3_k5_s1_e6_c112, ir_r4_k5_s2_e6_c192, ir_r1_k3_s1_e6_c320): the stride
# of each stage's first block; kernels come from the weights
_STAGE_STRIDES = (1, 2, 2, 2, 1, 2, 1)


def _tf_same_conv(x, w, stride=1, groups=1):
    """TensorFlow's 'SAME' padding: out = ceil(in / stride), the odd pixel padded after."""
    def pad(size):
        return max((-(-size // stride) - 1) * stride + w.shape[-1] - size, 0)
    ph, pw = pad(x.shape[-2]), pad(x.shape[-1])
    x = torch.nn.functional.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])
    return torch.nn.functional.conv2d(x, w, None, stride, 0, 1, groups)


def _tf_bn(x, state, prefix):
    """Inference batch norm with TF's epsilon (1e-3), as timm's tf_ models set it."""
    return torch.nn.functional.batch_norm(
        x, state[prefix + 'running_mean'], state[prefix + 'running_var'],
        state[prefix + 'weight'], state[prefix + 'bias'], False, 0., 1e-3)


def _reference_forward(state, x):
    """timm's tf_efficientnet_lite0 in inference.

    Written from its definition (not from the model under test): the output of every stage and of
    the head conv.
    """
    act = torch.nn.functional.relu6
    x = act(_tf_bn(_tf_same_conv(x, state['conv_stem.weight'], 2), state, 'bn1.'))
    feats = []
    for s, stride in enumerate(_STAGE_STRIDES):
        j = 0
        while f'blocks.{s}.{j}.conv_dw.weight' in state:
            p, inp = f'blocks.{s}.{j}.', x
            dw = state[p + 'conv_dw.weight']
            step = stride if j == 0 else 1
            if p + 'conv_pwl.weight' in state:  # inverted residual: expand, depthwise, project
                x = act(_tf_bn(_tf_same_conv(x, state[p + 'conv_pw.weight']), state, p + 'bn1.'))
                x = act(_tf_bn(_tf_same_conv(x, dw, step, dw.shape[0]), state, p + 'bn2.'))
                x = _tf_bn(_tf_same_conv(x, state[p + 'conv_pwl.weight']), state, p + 'bn3.')
            else:  # depthwise separable, no activation after the pointwise conv
                x = act(_tf_bn(_tf_same_conv(x, dw, step, dw.shape[0]), state, p + 'bn1.'))
                x = _tf_bn(_tf_same_conv(x, state[p + 'conv_pw.weight']), state, p + 'bn2.')
            if step == 1 and inp.shape == x.shape:
                x = x + inp
            j += 1
        feats.append(x)
    feats.append(act(_tf_bn(_tf_same_conv(x, state['conv_head.weight']), state, 'bn2.')))
    return feats


@pytest.mark.parametrize('size', [(97, 131), (320, 320)], ids=['odd', 'lite0'])
def test_efficientnet_lite_converted_from_timm_computes_what_timm_computes(size):
    """Equal outputs on a random input.

    TF 'SAME' padding (asymmetric at stride 2) and TF's BN epsilon are the model's, so the converted
    weights mean what they meant in timm.
    """
    state = _trained_like_state()
    model = EfficientNetLite(out_indices=(2, 3, 4, 5, 6))
    model.eval()  # NOTE: mmdet's EfficientNet.train() returns None, so no chaining
    load_state_dict_strict(model, checkpoint_filter_fn({'state_dict': state}, model))
    x = torch.rand(1, 3, *size)
    with torch.no_grad():
        ours = model(x)
        ref = _reference_forward(state, x)
    # mmdet's 7 layers are the stem, timm's stages 0-1 merged, 2, 3-4 merged, 5-6 merged and
    # the head conv: out_indices 2..6 are timm's stages 1, 2, 4, 6 and the head
    for got, want in zip(ours, [ref[1], ref[2], ref[4], ref[6], ref[7]]):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize('out_indices', [(3, 4, 5), (6,)], ids=['det', 'full'])
def test_efficientnet_lite_timm_tf_and_keras_layouts_give_the_same_weights(out_indices):
    timm = _timm_state()
    tf = _tf_from_timm(timm)
    assert sorted((k, list(v.shape)) for k, v in tf.items()) == sorted(
        (k, s) for k, s, _ in _layout('tf_efficientnet-lite0'))
    model = EfficientNetLite(out_indices=out_indices)
    converted = {}
    for name, ckpt in [('timm', {'state_dict': timm}), ('tf', tf),
                       ('keras', _keras_from_tf(tf, timm))]:
        dropped = {}
        converted[name] = checkpoint_filter_fn(ckpt, model, dropped)
        load_state_dict_strict(model, converted[name])
        with_head = out_indices == (6,)
        assert len(dropped) == (2 if with_head else 2 + (6 if name == 'timm' else 5))
        assert sum('classifier' in r for r in dropped.values()) == 2
    for key, value in converted['timm'].items():
        if not key.endswith('num_batches_tracked'):  # TF has no BN counters (0 then)
            assert torch.equal(converted['tf'][key], value), key
            assert torch.equal(converted['keras'][key], value), key
    # the converted stem / first depthwise / last projection are timm's tensors, unchanged
    assert torch.equal(converted['timm']['layers.0.conv.weight'], timm['conv_stem.weight'])
    assert torch.equal(converted['timm']['layers.1.0.depthwise_conv.conv.weight'],
                       timm['blocks.0.0.conv_dw.weight'])
    assert torch.equal(converted['timm']['layers.5.4.linear_conv.conv.weight'],
                       timm['blocks.6.0.conv_pwl.weight'])


def test_efficientnet_lite_tf_moving_averages_and_training_state():
    timm = _timm_state()
    tf = _tf_from_timm(timm)
    stem = 'efficientnet-lite0/stem/conv2d/kernel'
    ema = {k + '/ExponentialMovingAverage': v + 1 for k, v in tf.items()}
    ckpt = {**tf, **ema, 'global_step': np.array(10),
            stem + '/RMSProp': np.zeros_like(tf[stem])}
    model = EfficientNetLite(out_indices=(3, 4, 5))
    dropped = {}
    state = checkpoint_filter_fn(ckpt, model, dropped)
    load_state_dict_strict(model, state)
    # the moving averages are the weights; the raw ones and the training state are dropped
    torch.testing.assert_close(state['layers.0.conv.weight'], timm['conv_stem.weight'] + 1)
    assert 'ExponentialMovingAverage' in dropped[stem]
    assert 'training state' in dropped['global_step']
    assert 'training state' in dropped[stem + '/RMSProp']


def test_efficientnet_lite_refuses_other_architectures():
    model = EfficientNetLite(out_indices=(3, 4, 5))
    timm = _timm_state()
    with pytest.raises(CheckpointMismatchError, match='squeeze-excite.*not EfficientNet-Lite'):
        checkpoint_filter_fn({**timm, 'blocks.1.0.se.conv_reduce.weight': torch.zeros(8, 96, 1,
                                                                                      1)}, model)
    fewer = {k: v for k, v in timm.items() if not k.startswith('blocks.6.')}
    with pytest.raises(CheckpointMismatchError, match='15 blocks.*has 16'):
        checkpoint_filter_fn(fewer, model)
    wider = dict(timm, **{'blocks.2.0.conv_pw.weight': torch.zeros(200, 24, 1, 1)})
    with pytest.raises(CheckpointMismatchError, match=r'shape mismatches \(1\).*layers\.3\.0'):
        load_state_dict_strict(model, checkpoint_filter_fn(wider, model))
    with pytest.raises(CheckpointMismatchError, match='known layout'):
        checkpoint_filter_fn({'weight': torch.zeros(1)}, model)


def test_efficientnet_lite_loads_an_efficientdet_checkpoint_and_its_own_layout(tmp_path):
    source = EfficientNetLite(out_indices=(3, 4, 5))
    torch.save({'state_dict': {**{f'backbone.{k}': v for k, v in source.state_dict().items()},
                               'neck.conv.weight': torch.zeros(1)}}, tmp_path / 'det.pth')
    model = EfficientNetLite(out_indices=(3, 4, 5), init_cfg=dict(
        type='Pretrained', checkpoint=str(tmp_path / 'det.pth')))
    model.init_weights()
    for k, v in source.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    dropped = {}
    checkpoint_filter_fn(torch.load(tmp_path / 'det.pth'), model, dropped)
    assert dropped == {'neck.conv.weight': 'detector part outside the backbone'}
    with pytest.raises(ValueError, match='no `prefix`'):
        EfficientNetLite(init_cfg=dict(type='Pretrained', prefix='backbone', checkpoint='x'))


@pytest.mark.slow
def test_converter_cli_and_efficientdet_lite0_trains_from_its_output(tmp_path, toy_data):
    """Timm weights -> convert_backbone.py -> a toy EfficientDet-Lite0 that trains.

    timm weights -> convert_backbone.py -> the toy EfficientDet-Lite0 trains from them with the
    backbone loaded strictly (the log says so); a wrong family is refused with the keys.
    """
    src, dst = tmp_path / 'tf_efficientnet_lite0.pth', tmp_path / 'efficientnet-lite0_in1k.pth'
    timm = _timm_state()
    torch.save(timm, src)
    proc = run_tool_here('model_converters/convert_backbone.py', src, dst,
                         '--family', 'efficientnet-lite')
    assert '288 tensors converted' in proc.stdout
    assert 'dropped 2 keys: classifier.bias, classifier.weight (ImageNet classifier' in \
        proc.stdout
    assert 'conv_head.weight' in proc.stdout
    proc = run_tool_here('model_converters/convert_backbone.py', src, tmp_path / 'x.pth',
                         '--family', 'fan-hybrid', '--arch', 'tiny', check=False)
    assert proc.returncode == 1 and 'missing keys' in proc.stderr
    assert 'unexpected keys (296)' in proc.stderr and not (tmp_path / 'x.pth').exists()

    cfg = tmp_path / 'lite0_pretrained.py'
    toy = str(REPO / 'configs/toy/efficientdet-lite0_toy-coco.py')
    cfg.write_text(f'_base_ = [{toy!r}]\nmodel = dict(backbone=dict(init_cfg=dict(\n'
                   f"    _delete_=True, type='Pretrained', checkpoint={str(dst)!r})))\n")
    work = tmp_path / 'work'
    run_tool_here('train.py', cfg, '--work-dir', work, '--cfg-options', 'train_cfg.max_iters=2',
                  'train_cfg.val_begin=1000', 'default_hooks.checkpoint.interval=2',
                  'default_hooks.logger.interval=1', 'train_dataloader.batch_size=2',
                  'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False')
    log = next(work.rglob('*.log')).read_text()
    assert f'EfficientNetLite: loaded all 288 tensors from {dst}' in log
    assert 'dropped' not in log  # the converted file holds the backbone's tensors only
    assert re.search(r'Iter\(train\)\s+\[2/2\]', log), log[-2000:]


def test_mmdet_resnet_checkpoints_load_unchanged(tmp_path):
    """An mmdet model-zoo checkpoint loads into mmrobust's tools as it is.

    An mmdet model-zoo checkpoint (here of mmdet's own R50 Mask R-CNN config) loads into mmrobust's
    tools as it is, strictly; one with a key less is refused.
    """
    import mmdet
    from mmengine.config import Config

    from mmrobust.apis import init_model
    path = osp.join(osp.dirname(mmdet.__file__), '.mim', 'configs', 'mask_rcnn',
                    'mask-rcnn_r50_fpn_1x_coco.py')
    cfg = Config.fromfile(path)
    cfg.model.backbone.init_cfg = None  # no torchvision download
    torch.manual_seed(0)
    source = init_model(cfg)
    state = source.state_dict()
    classes = tuple(f'c{i}' for i in range(80))
    torch.save({'meta': {'dataset_meta': {'classes': classes}}, 'state_dict': state},
               tmp_path / 'mask_rcnn_r50.pth')
    model = init_model(cfg, str(tmp_path / 'mask_rcnn_r50.pth'))
    assert torch.equal(model.backbone.layer3[2].conv2.weight,
                       state['backbone.layer3.2.conv2.weight'])
    assert model.dataset_meta['classes'] == classes
    del state['roi_head.mask_head.conv_logits.bias']
    torch.save({'state_dict': state}, tmp_path / 'broken.pth')
    with pytest.raises(CheckpointMismatchError, match='missing keys.*conv_logits.bias'):
        init_model(cfg, str(tmp_path / 'broken.pth'))


def test_other_converters_report_what_they_drop():
    from mmrobust.models.tokenizers import VQGAN
    state = VQGAN('small_f16').state_dict()
    conv = convert_checkpoint('vqgan', {**{f'model.{k}': v for k, v in state.items()},
                                        'loss.discriminator.main.0.weight': torch.zeros(1)},
                              arch='small_f16')
    assert set(conv.state) == set(state)
    assert list(conv.dropped) == ['loss.discriminator.main.0.weight']
    assert 'discriminator' in conv.dropped['loss.discriminator.main.0.weight']


@pytest.mark.parametrize('config', ['efficientdet/efficientdet-d0_8xb16-300e_coco.py',
                                    'yolo/yolov3_d53_8xb8-320-273e_coco.py'])
def test_mmdet_backbones_load_released_layouts_strictly(config, tmp_path):
    """EfficientDet-D0's mmpretrain EfficientNet-B0 and YOLOv3's mmdet Darknet-53.

    The files load as they are (StrictPretrained), and a file with a key less is refused, not warned
    on.
    """
    from mmengine.config import Config
    from mmengine.registry import MODELS, init_default_scope
    cfg = Config.fromfile(REPO / 'configs' / config)
    init_default_scope('mmdet')
    backbone = cfg.model.backbone
    assert backbone.init_cfg.type == 'StrictPretrained'
    source = MODELS.build(dict(backbone, init_cfg=None))
    state = source.state_dict()
    prefix = backbone.init_cfg.get('prefix')
    if prefix:  # a whole mmpretrain classifier
        ckpt = {'state_dict': {**{f'{prefix}.{k}': v for k, v in state.items()},
                               'head.fc.weight': torch.zeros(1000, 1280)}}
    else:
        ckpt = {'state_dict': state}
    torch.save(ckpt, tmp_path / 'released.pth')
    model = MODELS.build(dict(backbone, init_cfg=dict(backbone.init_cfg,
                                                      checkpoint=str(tmp_path / 'released.pth'))))
    model.init_weights()
    for k, v in state.items():  # loaded, and not re-initialised by the children afterwards
        assert torch.equal(model.state_dict()[k], v), k
    first = next(iter(state))
    del state[first]
    torch.save({'state_dict': state}, tmp_path / 'short.pth')
    model = MODELS.build(dict(backbone, init_cfg=dict(type='StrictPretrained',
                                                      checkpoint=str(tmp_path / 'short.pth'))))
    with pytest.raises(CheckpointMismatchError, match=rf'missing keys \(1\): {re.escape(first)}'):
        model.init_weights()
