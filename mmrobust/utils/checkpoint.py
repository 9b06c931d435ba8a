"""Safe checkpoint loading, from torch 2.1 to today's.

torch >= 2.6 loads with ``weights_only=True``, which refuses the few Python types that mmengine puts
into its own checkpoints (the message hub's ``HistoryBuffer`` and the numpy arrays inside it), so
resume and ``load_from`` break. The tempting fix, ``weights_only=False``, would unpickle anything,
and a checkpoint is an untrusted download. mmrobust instead allow-lists exactly the types that
mmengine/OpenMMLab checkpoints contain and refuses everything else with an error naming the
offending globals. torch < 2.5 cannot extend its ``weights_only`` allow-list
(``torch.serialization.safe_globals``), so there the same allow-list (torch's own plus
mmrobust's) is enforced by a restricted unpickler: the same files load, the same ones are refused.

``import mmrobust`` installs :func:`load_from_local` as mmengine's loader for local paths, so
``load_from``, ``--resume``, ``init_cfg=dict(type='Pretrained', ...)`` and ``load_checkpoint`` all
use it.
"""
import _codecs
import _compat_pickle
import argparse
import os.path as osp
import pickle
import re
import types
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Union

import numpy as np
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader

from .errors import InputNotFoundError, MMRobustError

__all__ = ['UnsafeCheckpointError', 'NotACheckpointError', 'safe_load', 'register_safe_globals',
           'safe_globals', 'data_globals', 'load_from_local', 'install_safe_checkpoint_loader',
           'load_lightning_checkpoint', 'STUBBED_NAMESPACES']


class UnsafeCheckpointError(MMRobustError, pickle.UnpicklingError):
    """A checkpoint holds pickled objects outside the allow-list; nothing from it was run."""


def _numpy_globals() -> List[Any]:
    # NOTE: numpy pickles arrays through `_reconstruct` and one dtype class per dtype; these are
    # data containers, not code, and HistoryBuffer stores its history as numpy arrays.
    from numpy.core.multiarray import _reconstruct, scalar
    dtype_classes = [type(np.dtype(t)) for t in (
        np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
        np.uint64, np.float16, np.float32, np.float64)]
    return [_reconstruct, scalar, np.ndarray, np.dtype, *dtype_classes]


def _history_buffer_getattr(obj: Any, name: str) -> Any:
    """Stands in for ``getattr`` in checkpoints, for what mmengine needs of it and nothing else.

    mmengine pickles ``HistoryBuffer``'s statistics methods as ``getattr(HistoryBuffer, 'mean')``;
    a general ``getattr`` would let a crafted file reach arbitrary attributes.
    """
    if obj is HistoryBuffer and name in ('min', 'max', 'current', 'mean'):
        return getattr(HistoryBuffer, name)
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({obj!r}, {name!r}); only HistoryBuffer statistics are '
        'allowed')


# NOTE: argparse.Namespace is how timm-trained checkpoints (e.g. FAN's) store their `args`;
# `_codecs.encode` rebuilds the bytes of numpy arrays pickled with protocol 2 (data, not code:
# torch >= 2.4 allows it itself, torch 2.1 does not)
_SAFE_GLOBALS: List[Any] = [HistoryBuffer, argparse.Namespace, *_numpy_globals(),
                            (_history_buffer_getattr, 'builtins.getattr'), _codecs.encode]


def register_safe_globals(*objs: Any) -> None:
    """Allow further classes/functions in checkpoints (for types of your own you trust)."""
    for obj in objs:
        if obj not in _SAFE_GLOBALS:
            _SAFE_GLOBALS.append(obj)


def safe_globals() -> List[Any]:
    """The current allow-list (torch's own tensor/container types are always allowed)."""
    return list(_SAFE_GLOBALS)


def data_globals() -> Dict[str, Any]:
    """The globals that plain data pickles name, by pickled name.

    torch's ``weights_only`` allow-list (dtypes, devices, containers), numpy's arrays, scalars and
    dtypes, and a few builtins; none of them runs code. For restricted unpicklers of data files
    (e.g. the robustness loop's saved predictions).
    """
    import collections
    allowed = dict(torch._weights_only_unpickler._get_allowed_globals())
    allowed.update({_global_name(g): g for g in _numpy_globals()})
    allowed.update({'collections.OrderedDict': collections.OrderedDict, 'builtins.set': set,
                    'builtins.frozenset': frozenset, 'builtins.slice': slice,
                    'builtins.complex': complex, 'builtins.bytearray': bytearray})
    return allowed


def _global_name(obj: Any) -> str:
    if isinstance(obj, tuple):  # (stand-in, pickled name)
        return obj[1]
    return f'{obj.__module__}.{obj.__qualname__}'


def _unsafe_globals(f: Union[str, BinaryIO], exc: Exception) -> List[str]:
    allowed = {_global_name(g) for g in _SAFE_GLOBALS}
    names: List[str] = []
    try:
        if not isinstance(f, str):
            f.seek(0)
        names = [n for n in torch.serialization.get_unsafe_globals_in_checkpoint(f)
                 if n not in allowed]
    except Exception:  # NOTE: legacy (non-zip) files cannot be scanned; read the error instead
        names = re.findall(r'GLOBAL ([\w.]+)', str(exc))
    if not names:  # an allowed global misused, e.g. getattr on something else
        match = re.search(r'WeightsUnpickler error:\s*(.+?)(?:\n\n|$)', str(exc), re.S)
        names = [(match.group(1) if match else str(exc)).strip()[:300]]
    return sorted(set(names))


class NotACheckpointError(MMRobustError, ValueError):
    """The file is not something ``torch.save`` wrote (a plain pickle, text, empty...)."""


#: how a legacy (pre-zip) torch.save file starts: the pickled magic number
_LEGACY_MAGIC = b'\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19'


def _check_torch_file(f: Union[str, BinaryIO], name: str) -> None:
    """Raise :class:`NotACheckpointError` unless ``f`` starts like a torch.save file."""
    if isinstance(f, str):
        with open(f, 'rb') as fh:
            head = fh.read(len(_LEGACY_MAGIC))
    else:
        pos = f.tell()
        head = f.read(len(_LEGACY_MAGIC))
        f.seek(pos)
    if head.startswith(b'PK\x03\x04') or head == _LEGACY_MAGIC:
        return
    if not head:
        what = 'an empty file'
    elif head[:1] == b'\x80':
        what = ('a plain Python pickle, not a torch.save file (e.g. pickle.dump or mmdet\'s '
                '--out predictions). If it holds weights from a source you trust, load it with '
                'pickle and torch.save its state dict')
    else:
        what = f'not a torch.save file (it starts with {head[:8]!r})'
    raise NotACheckpointError(f'{name} is not a checkpoint: {what}.')


#: torch can extend its own ``weights_only`` allow-list (torch >= 2.5)
EXTENSIBLE_WEIGHTS_ONLY = hasattr(torch.serialization, 'safe_globals')


def safe_load(f: Union[str, BinaryIO], map_location: Optional[Any] = None) -> Any:
    """``torch.load`` with ``weights_only=True`` and mmrobust's allow-list.

    On torch < 2.5, the same allow-list through a restricted unpickler (nothing else resolves).

    Raises:
        NotACheckpointError: the file was not written by ``torch.save``.
        UnsafeCheckpointError: the file holds pickled objects that are not allow-listed.
    """
    name = f if isinstance(f, str) else getattr(f, 'name', '<buffer>')
    _check_torch_file(f, name)
    try:
        if not EXTENSIBLE_WEIGHTS_ONLY:
            # NOTE: weights_only=False only hands unpickling to the restricted module below
            return torch.load(f, map_location=map_location, weights_only=False,
                              pickle_module=_allow_listed_pickle)
        with torch.serialization.safe_globals(_SAFE_GLOBALS):
            return torch.load(f, map_location=map_location, weights_only=True)
    except _Refused as exc:
        unsafe = [exc.name]
    except pickle.UnpicklingError as exc:
        unsafe = _unsafe_globals(f, exc)
    raise UnsafeCheckpointError(
        f'Refusing to load checkpoint {name}: it contains pickled Python objects that are '
        f'not on the allow-list of checkpoint types: {", ".join(unsafe)}. Unpickling them '
        'could run arbitrary code, so nothing was loaded. If the file comes from a source '
        'you trust, rewrite it as plain tensors with `python tools/model_converters/'
        'clean_checkpoint.py IN OUT --trust-source`, or allow the types with '
        '`mmrobust.utils.register_safe_globals(...)`.') from None


def load_from_local(filename: str, map_location: Optional[Any] = None) -> Any:
    """mmengine loader for local paths that loads through :func:`safe_load`."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise InputNotFoundError(f'checkpoint {filename} can not be found.')
    return safe_load(filename, map_location)


def install_safe_checkpoint_loader() -> Callable:
    """Make mmengine load every local checkpoint through :func:`load_from_local`."""
    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local, force=True)
    return load_from_local


# -- PyTorch-Lightning checkpoints -----------------------------------------------------------------

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


class _Refused(pickle.UnpicklingError):
    """A global outside the allow-list, named (raised before anything from it ran)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _python3_name(module: str, name: str) -> str:
    """``module.name`` as Python 3 spells it (protocol 2 pickles write ``__builtin__``...).

    The stock ``find_class`` maps these names itself; an override must too.
    """
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    return f'{module}.{name}'


def _allowed(full: str) -> Any:
    """The object an allow-listed pickled global names, else None."""
    allowed = torch._weights_only_unpickler._get_allowed_globals()
    if full in allowed:
        return allowed[full]
    for obj in _SAFE_GLOBALS:
        if _global_name(obj) == full:
            return obj[0] if isinstance(obj, tuple) else obj
    return None


class _AllowListedUnpickler(pickle.Unpickler):
    """Resolves torch's ``weights_only`` globals and mmrobust's allow-list; refuses the rest."""

    def find_class(self, module: str, name: str) -> Any:
        full = _python3_name(module, name)
        found = _allowed(full)
        if found is None:
            raise _Refused(full)
        return found


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves allow-listed globals, stubs Lightning ones, refuses the rest."""

    def find_class(self, module: str, name: str) -> Any:
        full = _python3_name(module, name)
        found = _allowed(full)
        if found is not None:
            return found
        if full.startswith(STUBBED_NAMESPACES):
            return _stub(full)
        raise UnsafeCheckpointError(
            f'the file pickles {full}, which is neither a tensor type nor Lightning metadata; '
            'unpickling it could run code')


def _pickle_module(name: str, unpickler: type) -> types.SimpleNamespace:
    """A ``pickle_module`` for ``torch.load`` whose unpickling goes through ``unpickler``."""
    return types.SimpleNamespace(__name__=name, Unpickler=unpickler,
                                 load=lambda f, **kwargs: unpickler(f, **kwargs).load())


_allow_listed_pickle = _pickle_module('mmrobust_allow_listed_pickle', _AllowListedUnpickler)
_restricted_pickle = _pickle_module('mmrobust_restricted_pickle', _RestrictedUnpickler)


def load_lightning_checkpoint(path: str, map_location: Optional[Any] = 'cpu') -> Any:
    """Load a PyTorch-Lightning checkpoint without running code from it.

    A taming / latent-diffusion ``.ckpt``.

    Lightning pickles a few of its own objects next to the weights (callback states keyed by the
    callback class, ``AttributeDict`` hyper-parameters, sometimes OmegaConf containers), which
    ``weights_only=True`` refuses and which unpickling for real would import Lightning to build.
    This loader resolves torch's own ``weights_only`` allow-list plus mmrobust's, replaces every
    global of the Lightning / OmegaConf namespaces (:data:`STUBBED_NAMESPACES`) by an inert
    stand-in that only records its arguments, and refuses any other global (``os.system``...).

    Raises:
        UnsafeCheckpointError: the file pickles something else; nothing from it ran.
    """
    try:
        # NOTE: weights_only=False only hands unpickling to the restricted module above
        return torch.load(path, map_location=map_location, weights_only=False,
                          pickle_module=_restricted_pickle)
    except UnsafeCheckpointError as exc:
        raise UnsafeCheckpointError(f'Refusing to load {path}: {exc}. Nothing was loaded.'
                                    ) from None
