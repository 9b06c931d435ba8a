"""Safe loading of PyTorch-Lightning tokenizer checkpoints (taming / latent-diffusion ``.ckpt``).

Lightning pickles a few of its own objects next to the weights (callback states keyed by the
callback class, ``AttributeDict`` hyper-parameters, sometimes OmegaConf containers). torch >= 2.6
refuses them under ``weights_only=True``, and unpickling them for real would import Lightning and
run whatever the file names. Such files are read with a restricted unpickler instead: it resolves
only torch's own ``weights_only`` allow-list plus mmrobust's, replaces every global of the
Lightning / OmegaConf namespaces by an inert stand-in that just records its arguments, and
refuses any other global (``os.system``...). No code from the file runs.
"""
import pickle
import types
from typing import Any, Dict

import torch

from ...utils.checkpoint import UnsafeCheckpointError, _global_name, safe_globals, safe_load
from ..utils import unwrap_state_dict

#: Module prefixes whose pickled objects are replaced by inert stand-ins.
STUBBED_NAMESPACES = ('pytorch_lightning.', 'lightning.', 'lightning_fabric.', 'omegaconf.')


class _Inert:
    """Stands in for a pickled Lightning object: stores what it was built from, does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.entries = args, dict(kwargs)

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        # NOTE: dict subclasses are rebuilt by __new__ + SETITEMS, without __init__
        self.__dict__.setdefault('entries', {})[key] = value

    def __hash__(self) -> int:  # NOTE: callback classes are used as dict keys
        return id(self)


def _stub(name: str) -> type:
    module, _, qualname = name.rpartition('.')
    return type(qualname, (_Inert, ), {'__module__': module})


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves allow-listed globals, stubs Lightning ones, refuses the rest."""

    def find_class(self, module: str, name: str) -> Any:
        full = f'{module}.{name}'
        allowed = torch._weights_only_unpickler._get_allowed_globals()
        if full in allowed:
            return allowed[full]
        for obj in safe_globals():
            if _global_name(obj) == full:
                return obj[0] if isinstance(obj, tuple) else obj
        if full.startswith(STUBBED_NAMESPACES):
            return _stub(full)
        raise UnsafeCheckpointError(
            f'the file pickles {full}, which is neither a tensor type nor Lightning metadata; '
            'unpickling it could run code')


_restricted_pickle = types.SimpleNamespace(
    __name__='mmrobust_restricted_pickle', Unpickler=_RestrictedUnpickler,
    load=lambda f, **kwargs: _RestrictedUnpickler(f, **kwargs).load())


def load_tokenizer_checkpoint(path: str) -> Dict[str, torch.Tensor]:
    """The state dict of a tokenizer checkpoint: plain, mmengine-wrapped or Lightning ``.ckpt``."""
    try:
        raw = safe_load(path, map_location='cpu')
    except UnsafeCheckpointError:
        try:
            # NOTE: weights_only=False only hands unpickling to the restricted module above
            raw = torch.load(path, map_location='cpu', weights_only=False,
                             pickle_module=_restricted_pickle)
        except UnsafeCheckpointError as exc:
            raise UnsafeCheckpointError(f'Refusing to load {path}: {exc}. Nothing was loaded.'
                                        ) from None
    return unwrap_state_dict(raw, strip_prefixes=())
