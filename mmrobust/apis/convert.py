"""Offline conversion of upstream backbone / tokenizer weights, one driver for every family.

Each family converts with its own ``checkpoint_filter_fn`` (the one ``init_cfg=dict(type=
'Pretrained')`` uses at training time), then loads the result strictly into the target model:
a checkpoint of another architecture or variant is refused with the mismatching keys listed.
Everything the filter leaves out is reported with the reason, and so is every layer the
source cannot provide (it keeps its fresh initialisation whenever the file is loaded).
"""
import os.path as osp
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn

from ..utils.errors import InputNotFoundError, UnknownNameError

__all__ = ['FAMILIES', 'Conversion', 'build_target', 'convert_checkpoint', 'read_checkpoint']


#: ``filter(checkpoint, model, dropped)``: the family's ``checkpoint_filter_fn``
Filter = Callable[[Mapping, nn.Module, Dict[str, str]], Dict[str, torch.Tensor]]


def _own_filter(checkpoint: Mapping, model: nn.Module, dropped: Dict[str, str]) -> Dict:
    """The backbone's own converter (``model.convert_checkpoint``: FAN, EfficientNet-Lite)."""
    return model.convert_checkpoint(checkpoint, dropped)


def _drvit_filter(checkpoint: Mapping, model: nn.Module, dropped: Dict[str, str]) -> Dict:
    from ..models.backbones.drvit import checkpoint_filter_fn
    return checkpoint_filter_fn(checkpoint, model, dropped)


def _vqgan_filter(checkpoint: Mapping, model: nn.Module, dropped: Dict[str, str]) -> Dict:
    from ..models.tokenizers.vqgan import checkpoint_filter_fn
    return checkpoint_filter_fn(checkpoint, model, dropped)


@dataclass
class _Family:
    """A family's target model, its options and its checkpoint conversion.

    ``build(arch, out_type)`` makes the model, ``archs`` / ``out_types`` are the options,
    ``filter`` converts an upstream checkpoint and ``separate`` names the parts loaded from a
    checkpoint of their own.
    """
    build: Callable[[str, str], nn.Module]
    archs: Tuple[str, ...]
    default_arch: str
    out_types: Tuple[str, ...]
    source: str  # what the upstream file is, for --help
    filter: Filter = _own_filter
    #: model keys the file cannot hold and that keep their own weights (not "new"): Dr-ViT's
    #: tokenizer loads from its own checkpoint
    separate: Tuple[str, ...] = ()

    def allowed_missing(self, model: nn.Module) -> Tuple[str, ...]:
        """Prefixes of model keys the converted file may lack."""
        newly_added = model.newly_added() if hasattr(model, 'newly_added') else ()
        return tuple(newly_added) + self.separate


def _fan_hybrid(arch: str, out_type: str) -> nn.Module:
    from ..models.backbones import FANHybrid
    return FANHybrid(arch, out_type=out_type)


def _fan_swin(arch: str, out_type: str) -> nn.Module:
    from ..models.backbones import FANSwin
    return FANSwin(arch, out_type=out_type)


def _drvit(arch: str, out_type: str) -> nn.Module:
    from ..models.backbones import DrViT

    # NOTE: the transformer part is what a ViT checkpoint holds; the tokenizer keeps its own
    # checkpoint, so an untrained one of the default shape stands in for it here
    return DrViT(arch, tokenizer=dict(type='VQGAN', arch='small_f16'))


def _vqgan(arch: str, out_type: str) -> nn.Module:
    from ..models.tokenizers import VQGAN
    return VQGAN(arch)


def _efficientnet_lite(arch: str, out_type: str) -> nn.Module:
    from ..models.backbones.efficientnet_lite import EfficientNetLite

    # det: the outputs EfficientDet-Lite's BiFPN reads (its config's out_indices); full: also
    # the 1280-channel head conv
    return EfficientNetLite(arch, out_indices=(3, 4, 5) if out_type == 'det' else (6,))


FAMILIES: Dict[str, _Family] = {
    'fan-hybrid': _Family(_fan_hybrid, ('tiny', 'small', 'base', 'large'), 'small',
                          ('det', 'seg', 'cls'), 'NVlabs FAN fan_hybrid_*.pth.tar'),
    'fan-swin': _Family(_fan_swin, ('tiny', 'small', 'base'), 'tiny', ('dense', 'cls'),
                        'a FAN-Swin classification checkpoint (FANSwin(out_type="cls"))'),
    'drvit': _Family(_drvit, ('tiny', 'small', 'base'), 'small', ('dense',),
                     'a timm / DeiT ViT (deit_*_patch16_224.pth)', _drvit_filter,
                     separate=('tokenizer.',)),
    'vqgan': _Family(_vqgan, ('f16_1024', 'f16_16384', 'f8_16384', 'small_f16'), 'f16_1024',
                     ('tokenizer',), 'a taming-transformers / latent-diffusion VQGAN .ckpt',
                     _vqgan_filter),
    'efficientnet-lite': _Family(_efficientnet_lite, ('lite0',), 'lite0', ('det', 'full'),
                                 "timm's tf_efficientnet_lite0 .pth, or the TF / TF-Keras "
                                 'variables as .npz'),
}


def build_target(family: str, arch: Optional[str] = None, out_type: Optional[str] = None
                 ) -> nn.Module:
    """The model a family's checkpoint is converted for, freshly initialised."""
    if family not in FAMILIES:
        raise UnknownNameError(f'unknown family {family!r}; choose from {sorted(FAMILIES)}')
    spec = FAMILIES[family]
    arch = arch or spec.default_arch
    out_type = out_type or spec.out_types[0]
    if arch not in spec.archs:
        raise UnknownNameError(f'{family} has no arch {arch!r}; choose from {list(spec.archs)}')
    if out_type not in spec.out_types:
        raise UnknownNameError(f'{family} has no out type {out_type!r}; choose from '
                               f'{list(spec.out_types)}')
    model = spec.build(arch, out_type)
    if hasattr(model, '_init_from_scratch'):
        model._init_from_scratch()  # what the layers the source lacks start from
    # NOTE: VQGAN and EfficientNet-Lite keep their constructors' initialisation: a checkpoint
    # fills every one of their tensors
    return model


def read_checkpoint(path: str) -> Mapping:
    """A torch checkpoint (loaded safely).

    Also an ``.npz`` of named arrays (TensorFlow variables exported with numpy; arrays of objects
    are refused).
    """
    if not osp.isfile(path):
        raise InputNotFoundError(f'checkpoint {path!r} not found')
    if path.endswith('.npz'):
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    from ..models.checkpoint import load_tokenizer_checkpoint
    from ..utils import safe_load
    if path.endswith('.ckpt'):  # Lightning: pickled training state around the weights
        return load_tokenizer_checkpoint(path)
    return safe_load(path, map_location='cpu')


@dataclass
class Conversion:
    """The result of :func:`convert_checkpoint`."""
    model: nn.Module
    state: Dict[str, torch.Tensor]  # the converted tensors, as the model names them
    dropped: Dict[str, str]  # checkpoint key -> why it was not converted
    new: Tuple[str, ...]  # model keys the checkpoint cannot provide (fresh initialisation)


def convert_checkpoint(family: str, checkpoint: Mapping, arch: Optional[str] = None,
                       out_type: Optional[str] = None, source: str = 'checkpoint'
                       ) -> Conversion:
    """Convert ``checkpoint`` for a family's model and load it strictly.

    Raises:
        CheckpointMismatchError: the converted keys do not match the model (listed).
    """
    from ..models.checkpoint import load_state_dict_strict
    model = build_target(family, arch, out_type)
    spec = FAMILIES[family]
    dropped: Dict[str, str] = {}
    state = spec.filter(checkpoint, model, dropped)
    load_state_dict_strict(model, state, spec.allowed_missing(model), source=source)
    new = tuple(sorted(k for k in model.state_dict() if k not in state
                       and not any(k.startswith(p) for p in spec.separate)))
    return Conversion(model, state, dropped, new)
