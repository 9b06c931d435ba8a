"""Architecture helpers shared by the model families.

Variant lookup, from-scratch initialisation, unwrapping a model wrapper. Checkpoint loading lives in
:mod:`mmrobust.models.checkpoint`.
"""
from typing import Iterable, Mapping, Optional, Sequence, Tuple, Type, Union

import torch.nn as nn
from mmengine.model import is_model_wrapper
from torch.nn.modules.batchnorm import _BatchNorm

from ..utils.errors import UnknownNameError

__all__ = ['NORMS', 'init_trunc_normal_', 'resolve_arch', 'unwrap_model']

def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside a model wrapper (DDP, FSDP, mmengine's separate DDP), else ``model``."""
    return model.module if is_model_wrapper(model) else model


def resolve_arch(arch: Union[str, Mapping], zoo: Mapping[str, Mapping], family: str,
                 optional: Sequence[str] = ()) -> Tuple[str, dict]:
    """``(name, settings)`` of a variant.

    A name of ``zoo`` or a custom dict with the zoo's keys (plus any of ``optional``); anything else
    is an error that lists the choices.
    """
    keys = sorted(next(iter(zoo.values())))
    if isinstance(arch, str):
        if arch not in zoo:
            raise UnknownNameError(f'unknown {family} arch {arch!r}; choose from {sorted(zoo)} '
                                   f'or pass a dict with keys {keys}')
        return arch, dict(zoo[arch])
    missing = sorted(set(keys) - set(arch))
    unknown = sorted(set(arch) - set(keys) - set(optional))
    if missing or unknown:
        raise UnknownNameError(f'a custom {family} arch needs exactly the keys {keys}'
                               + (f' (optionally {sorted(optional)})' if optional else '')
                               + f'; missing: {missing}, unknown: {unknown}')
    return 'custom', dict(arch)


NORMS = (nn.LayerNorm, nn.GroupNorm, _BatchNorm)


def init_trunc_normal_(root: nn.Module, layers: Tuple[Type[nn.Module], ...] = (nn.Linear, ),
                       std: float = .02, skip: Iterable[nn.Module] = (),
                       extra: Optional[Mapping[Type[nn.Module], Sequence[str]]] = None) -> None:
    """timm-style from-scratch initialisation of ``root``, module by module in order.

    Weights of ``layers`` get a truncated normal (``std``) and zero biases; norms (LayerNorm,
    GroupNorm, BatchNorm and their subclasses) unit weights and zero biases; parameters named
    in ``extra`` per module type (e.g. relative-position tables) a truncated normal. Modules in
    ``skip`` and their submodules keep their weights (frozen parts such as a tokenizer).
    """
    frozen = {id(m) for s in skip for m in s.modules()}
    for module in root.modules():
        if id(module) in frozen:
            continue
        if isinstance(module, layers):
            nn.init.trunc_normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, NORMS) and getattr(module, 'weight', None) is not None:
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        for kind, names in (extra or {}).items():
            if isinstance(module, kind):
                for name in names:
                    nn.init.trunc_normal_(getattr(module, name), std=std)
