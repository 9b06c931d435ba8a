"""EfficientNet-Lite, the backbone of EfficientDet-Lite.

B-series blocks without squeeze-excite, ReLU6 (mobile / edge friendly), on mmdet's ``EfficientNet``.

ImageNet weights load strictly through :func:`checkpoint_filter_fn`, from any of the released
layouts: timm's ``tf_efficientnet_lite0`` state dict, the TensorFlow checkpoint of the
official release / TF-Hub (``efficientnet-lite0/blocks_K/...``, as ``.npz``), a TF-Keras model
(``block1a_dwconv/...``, as ``.npz``) or mmdet's own key layout (also inside an EfficientDet
checkpoint, under ``backbone.``). The key mapping is in ``configs/efficientdet/README.md``.
"""
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from mmdet.models.backbones import EfficientNet
from mmengine.model.weight_init import initialize
from typing_extensions import override

from ...registry import MODELS
from ..checkpoint import CheckpointMismatchError, load_pretrained, unwrap_state_dict
from ..layers.separable_conv import BN_TF

__all__ = ['EfficientNetLite', 'checkpoint_filter_fn']


def _without_se(settings: list) -> list:
    """mmdet's EfficientNet layer table with the squeeze-excite ratio (column 2) set to 0."""
    return [[[*block[:2], 0, *block[3:]] for block in stage] for stage in settings]


_SCRATCH_INIT = [dict(type='Kaiming', layer='Conv2d'),
                 dict(type='Constant', layer=['_BatchNorm', 'GroupNorm'], val=1)]


@MODELS.register_module()
class EfficientNetLite(EfficientNet):
    """EfficientNet-Lite: B-series blocks without squeeze-excite, ReLU6 (mobile/edge friendly).

    Same arguments and outputs as mmdet's ``EfficientNet``; only ``lite0`` (EfficientDet-Lite0's
    backbone; the larger Lite models keep an unscaled stem and head, which mmdet's scaling rule
    does not express). ``init_cfg=dict(type='Pretrained', checkpoint=PATH)`` loads ImageNet
    weights of any layout :func:`checkpoint_filter_fn` reads, strictly (mmengine's own
    ``Pretrained`` loader would skip mismatched keys with a warning).
    """

    layer_settings = {'l': _without_se(EfficientNet.layer_settings['b'])}
    # width factor, depth factor, resolution
    arch_settings = {'lite0': (1.0, 1.0, 320)}

    def __init__(self, arch: str = 'lite0', drop_path_rate: float = 0.,
                 out_indices: Sequence[int] = (6,), frozen_stages: int = 0,
                 conv_cfg: dict = dict(type='Conv2dAdaptivePadding'), norm_cfg: dict = BN_TF,
                 act_cfg: dict = dict(type='ReLU6'), norm_eval: bool = False,
                 with_cp: bool = False, init_cfg: Optional[dict] = None) -> None:
        if init_cfg is not None and init_cfg.get('type') == 'Pretrained' and init_cfg.get(
                'prefix'):
            raise ValueError(
                "EfficientNetLite's init_cfg takes no `prefix`: its checkpoint filter finds the "
                "backbone in a detector checkpoint itself; remove `prefix` "
                f"(got {init_cfg['prefix']!r})")
        super().__init__(arch=arch, drop_path_rate=drop_path_rate, out_indices=out_indices,
                         frozen_stages=frozen_stages, conv_cfg=conv_cfg, norm_cfg=norm_cfg,
                         act_cfg=act_cfg, norm_eval=norm_eval, with_cp=with_cp,
                         init_cfg=init_cfg if init_cfg is not None else _SCRATCH_INIT)
        self.arch_name = arch

    @override
    def init_weights(self) -> None:
        if isinstance(self.init_cfg, dict) and self.init_cfg.get('type') == 'Pretrained':
            initialize(self, _SCRATCH_INIT)
            load_pretrained(self, self.init_cfg['checkpoint'], checkpoint_filter_fn)
            self._is_init = True
        else:
            super().init_weights()

    def convert_checkpoint(self, checkpoint: dict, dropped: Optional[Dict[str, str]] = None
                           ) -> Dict[str, torch.Tensor]:
        """A timm / TF EfficientNet-Lite checkpoint in this model's keys."""
        return checkpoint_filter_fn(checkpoint, self, dropped)

    def newly_added(self) -> Tuple[str, ...]:
        """None: the checkpoint holds every layer."""
        return ()


# -- checkpoints -----------------------------------------------------------------------------------
# Every layout is parsed into canonical names, then mapped onto the model's own blocks in order
# (mmdet merges timm's / TF's 7 stages into 5 layers, so only the flat block order is shared):
#   ('stem' | 'head', 'conv' | 'bn', param)   ('block', i, 'expand' | 'dw' | 'project', ...)
_BN = {'gamma': 'weight', 'beta': 'bias', 'moving_mean': 'running_mean',
       'moving_variance': 'running_var'}
_TIMM_BN = ('weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked')
_ROLE_MODULE = {'expand': 'expand_conv', 'dw': 'depthwise_conv', 'project': 'linear_conv'}
_SE = re.compile(r'(^|[./_])se([./_]|$)')
#: canonical name -> (the checkpoint's key, tensor in PyTorch's layout)
_Canonical = Dict[tuple, Tuple[str, torch.Tensor]]


def _tf_tensor(name: str, value: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A TF variable in PyTorch's layout: HWIO convs, HWC1 depthwise convs, (in, out) dense."""
    value = torch.as_tensor(np.asarray(value))
    if name.endswith('depthwise_kernel'):
        return value.permute(2, 3, 0, 1).contiguous()
    if name.endswith('kernel') and value.ndim == 4:
        return value.permute(3, 2, 0, 1).contiguous()
    if name.endswith('kernel') and value.ndim == 2:
        return value.t().contiguous()
    return value


def _parse_timm(state: Mapping, dropped: Dict[str, str]) -> _Canonical:
    blocks = sorted({tuple(map(int, m.groups())) for k in state
                     if (m := re.match(r'blocks\.(\d+)\.(\d+)\.', k))})
    index = {b: i for i, b in enumerate(blocks)}
    out = {}
    for key, value in state.items():
        if m := re.fullmatch(r'blocks\.(\d+)\.(\d+)\.(\w+)\.(\w+)', key):
            s, j, module, param = int(m[1]), int(m[2]), m[3], m[4]
            inverted = f'blocks.{s}.{j}.conv_pwl.weight' in state
            roles = ({'conv_pw': ('expand', 'conv'), 'bn1': ('expand', 'bn'),
                      'conv_dw': ('dw', 'conv'), 'bn2': ('dw', 'bn'),
                      'conv_pwl': ('project', 'conv'), 'bn3': ('project', 'bn')} if inverted else
                     {'conv_dw': ('dw', 'conv'), 'bn1': ('dw', 'bn'),
                      'conv_pw': ('project', 'conv'), 'bn2': ('project', 'bn')})
            if module not in roles:
                raise CheckpointMismatchError(f'unknown EfficientNet block key {key!r}')
            out[('block', index[(s, j)], *roles[module], param)] = key, value
        elif key.startswith(('conv_stem.', 'bn1.', 'conv_head.', 'bn2.')):
            module, param = key.split('.')
            part = 'stem' if module in ('conv_stem', 'bn1') else 'head'
            out[(part, 'conv' if module.startswith('conv') else 'bn', param)] = key, value
        elif key.startswith('classifier.'):
            dropped[key] = 'ImageNet classifier (a dense backbone has none)'
        else:
            raise CheckpointMismatchError(f'unknown timm EfficientNet key {key!r}')
    return out


def _tf_name(raw: str) -> str:
    return raw[:-2] if raw.endswith(':0') else raw


def _parse_tf(state: Mapping, dropped: Dict[str, str]) -> _Canonical:
    """The official TF / TF-Hub variables (``<model>/blocks_K/...``) or TF-Keras names.

    ``block2a_expand_conv/kernel``. The exponential moving averages replace the raw weights when
    both are there (they are the weights the release evaluates).
    """
    names = {_tf_name(k): k for k in state}
    ema = '/ExponentialMovingAverage'
    keras_blocks = sorted({(int(m[1]), m[2]) for n in names
                           if (m := re.match(r'(?:.*/)?block(\d+)([a-z])_', n))})
    keras_index = {b: i for i, b in enumerate(keras_blocks)}
    out = {}
    for name, raw in names.items():
        value = state[raw]
        if name.endswith(ema):
            continue
        if not re.search(r'(kernel|bias|gamma|beta|moving_mean|moving_variance)$', name):
            dropped[raw] = 'training state (step counter / optimizer slot), not a weight'
            continue
        if name + ema in names:
            dropped[raw] = ('raw weight: its ExponentialMovingAverage, the weights the release '
                            'evaluates, is converted instead')
            value = state[names[name + ema]]
        var = name.rsplit('/', 1)[-1]
        param = _BN.get(var, 'weight' if 'kernel' in var else var)
        tensor = _tf_tensor(var, value)
        if m := re.search(r'(?:^|/)blocks_(\d+)/(\w+)/\w+$', name):
            i, module = int(m[1]), m[2]
            inverted = any(re.search(rf'(?:^|/)blocks_{i}/conv2d_1/', n) for n in names)
            bn = r'(?:tpu_)?batch_normalization'
            roles = ([('conv2d', 'expand', 'conv'), (f'{bn}', 'expand', 'bn'),
                      ('depthwise_conv2d', 'dw', 'conv'), (f'{bn}_1', 'dw', 'bn'),
                      ('conv2d_1', 'project', 'conv'), (f'{bn}_2', 'project', 'bn')] if inverted
                     else [('depthwise_conv2d', 'dw', 'conv'), (f'{bn}', 'dw', 'bn'),
                           ('conv2d', 'project', 'conv'), (f'{bn}_1', 'project', 'bn')])
            role = next((r[1:] for r in roles if re.fullmatch(r[0], module)), None)
            if role is None:
                raise CheckpointMismatchError(f'unknown EfficientNet block variable {raw!r}')
            out[('block', i, *role, param)] = raw, tensor
        elif m := re.search(r'(?:^|/)block(\d+)([a-z])_(expand_conv|expand_bn|dwconv|bn|'
                            r'project_conv|project_bn)/\w+$', name):
            role = {'expand_conv': ('expand', 'conv'), 'expand_bn': ('expand', 'bn'),
                    'dwconv': ('dw', 'conv'), 'bn': ('dw', 'bn'),
                    'project_conv': ('project', 'conv'), 'project_bn': ('project', 'bn')}[m[3]]
            out[('block', keras_index[(int(m[1]), m[2])], *role, param)] = raw, tensor
        elif m := re.search(r'(?:^|/)(stem|head)/(conv2d|(?:tpu_)?batch_normalization)/\w+$',
                            name) or re.search(r'(?:^|/)(stem|top)_(conv|bn)/\w+$', name):
            part = 'stem' if m[1] == 'stem' else 'head'
            out[(part, 'conv' if 'conv' in m[2] else 'bn', param)] = raw, tensor
        elif re.search(r'(?:^|/)(head/dense|predictions)/\w+$', name):
            dropped[raw] = 'ImageNet classifier (a dense backbone has none)'
        else:
            raise CheckpointMismatchError(f'unknown TensorFlow EfficientNet variable {raw!r}')
    return out


def _model_blocks(model: EfficientNet) -> List[str]:
    """The model's block prefixes (``layers.L.J``) in forward order, stem and head excluded."""
    blocks = []
    for i, layer in enumerate(model.layers):
        if i == 0 or not isinstance(layer, torch.nn.Sequential):
            continue
        blocks += [f'layers.{i}.{j}' for j in range(len(layer))]
    return blocks


def checkpoint_filter_fn(checkpoint: Mapping, model: EfficientNet,
                         dropped: Optional[Dict[str, str]] = None) -> Dict[str, torch.Tensor]:
    """ImageNet EfficientNet-Lite weights of any released layout in mmdet's key layout.

    Args:
        checkpoint: A timm state dict (``conv_stem.weight``, ``blocks.S.J...``), TF variables
            (``efficientnet-lite0/blocks_K/...`` or TF-Keras ``block1a_...``, values as arrays,
            HWIO kernels), an mmdet ``EfficientNet`` state dict, or an EfficientDet checkpoint
            (its ``backbone.*``), possibly wrapped in ``state_dict`` / ``model``.
        model: The backbone to fill; its blocks fix the order and the head conv (a backbone
            built without ``out_indices`` 6 has no head, and the checkpoint's is dropped).
        dropped: If given, receives every checkpoint key that is not converted, with the reason.

    Raises:
        CheckpointMismatchError: an unknown key, squeeze-excite weights (EfficientNet-B, not
        Lite), or a different number of blocks; the strict load then checks every shape.
    """
    dropped = {} if dropped is None else dropped
    if isinstance(checkpoint, Mapping) and not any(isinstance(v, (torch.Tensor, np.ndarray))
                                                   for v in checkpoint.values()):
        checkpoint = unwrap_state_dict(checkpoint)
    state = dict(checkpoint)
    se = sorted(k for k in state if _SE.search(_tf_name(k)))
    if se:
        raise CheckpointMismatchError(
            f'the checkpoint has squeeze-excite weights ({len(se)}, e.g. {se[:3]}): it is an '
            'EfficientNet-B checkpoint, not EfficientNet-Lite (timm: tf_efficientnet_lite0)')
    if any(k.startswith('backbone.') for k in state):  # an EfficientDet / mmdet detector
        for k in [k for k in state if not k.startswith('backbone.')]:
            dropped[k] = "detector part outside the backbone"
            del state[k]
        state = {k[len('backbone.'):]: v for k, v in state.items()}
    state = {k[len('module.'):] if k.startswith('module.') else k: v for k, v in state.items()}
    if any(k.startswith('layers.') for k in state):  # mmdet's own layout
        return {k: torch.as_tensor(v) for k, v in state.items()}
    if 'conv_stem.weight' in state:
        canon = _parse_timm(state, dropped)
    elif any('/' in k for k in state):
        canon = _parse_tf(state, dropped)
    else:
        raise CheckpointMismatchError(
            'not an EfficientNet-Lite checkpoint of a known layout (timm conv_stem.weight, '
            f'TF .../stem/conv2d/kernel, mmdet layers.*); first keys: {sorted(state)[:10]}')

    blocks = _model_blocks(model)
    n_src = 1 + max((k[1] for k in canon if k[0] == 'block'), default=-1)
    if n_src != len(blocks):
        raise CheckpointMismatchError(
            f'the checkpoint has {n_src} blocks, {type(model).__name__}({model.arch_name}) has '
            f'{len(blocks)}: is it another EfficientNet variant?')
    own = model.state_dict()
    head = f'layers.{len(model.layers) - 1}'
    has_head = f'{head}.conv.weight' in own and not isinstance(model.layers[-1],
                                                               torch.nn.Sequential)
    out = {}
    for key, (source, value) in canon.items():
        if key[0] == 'block':
            _, i, role, part, param = key
            target = f'{blocks[i]}.{_ROLE_MODULE[role]}.{part}.{param}'
        elif key[0] == 'stem':
            target = f'layers.0.{key[1]}.{key[2]}'
        elif has_head:
            target = f'{head}.{key[1]}.{key[2]}'
        else:
            dropped[source] = ('1280-channel head conv: the backbone is built without it '
                               '(out_indices below 6)')
            continue
        out[target] = value
    # TF keeps no BN update counters; mmdet's BN layers have them
    for k in own:
        if k.endswith('num_batches_tracked') and k not in out and k.rsplit('.', 1)[0] + \
                '.weight' in out:
            out[k] = torch.tensor(0, dtype=torch.long)
    return out
