"""A cell's predictions on disk: the file a metric is computed from, in this process or another.

Rank 0 writes the gathered results of a cell's metrics (:func:`~.loop.gather_parts`)
to a predictions file next to the results file, atomically, with a header that names the
evaluation (the results identity's fingerprint) and the cell; the metric worker
(:mod:`.metric_worker`) computes from it. The file is removed only after the cell's metrics are
in the results file, so a run killed during a metric resumes from it without inference. The
pickler writes, and the unpickler reads, only data: tensors, arrays, mmengine's / mmdet's /
mmseg's data structures and builtins.
"""
import json
import os
import os.path as osp
import pickle
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from mmengine.logging import print_log

from ..utils.io import TMP_MARK, atomic_write
from .results import ResultsLayout

__all__ = ['DATA_STRUCTURE_MODULES', 'PREDICTIONS_FORMAT', 'PredictionsPicklingError',
           'load_cell_predictions', 'predictions_dir', 'predictions_path',
           'read_predictions_header', 'save_cell_predictions', 'saved_cells']

PREDICTIONS_FORMAT = 'mmrobust-cell-predictions/2'


def predictions_dir(results_path: str) -> str:
    """``<results stem>_predictions/`` next to the results file.

    The cells whose metrics are not recorded yet.
    """
    return ResultsLayout(results_path).predictions


def predictions_path(folder: str, corruption: str, severity: int) -> str:
    """Where a cell's predictions file lives in ``folder``."""
    return ResultsLayout.cell_file(folder, corruption, severity, 'pkl')


#: Modules whose classes are data containers a metric may keep in its results (OpenMMLab's
#: data elements and mask structures): built by ``__new__`` and a ``__dict__`` update, no code.
DATA_STRUCTURE_MODULES = ('mmengine.structures.', 'mmdet.structures.', 'mmseg.structures.')
_ALLOWED: Dict[str, Any] = {}


def _allowed(module: str, name: str) -> Any:
    """The global ``module.name`` if a predictions file may name it, else None."""
    if not _ALLOWED:
        from ..utils.checkpoint import data_globals
        _ALLOWED.update(data_globals())
    full = f'{module}.{name}'
    if full in _ALLOWED:
        return _ALLOWED[full]
    if module.startswith(DATA_STRUCTURE_MODULES) and '.' not in name:
        import importlib
        found = getattr(importlib.import_module(module), name, None)
        if isinstance(found, type):
            return found
    return None


class PredictionsPicklingError(pickle.PicklingError):
    """A metric keeps an object a predictions file may not hold (the message names it)."""


class _PredictionsPickler(pickle.Pickler):
    """Pickles tensors as numpy arrays (by persistent id).

    A predictions file needs no torch storage unpickling, which runs ``torch.load`` on bytes from
    the file. Any other object must be one the loader accepts, checked here, before the file is
    written.
    """

    def persistent_id(self, obj: Any) -> Any:
        import torch
        if isinstance(obj, torch.Tensor):
            tensor = obj.detach().cpu()
            if tensor.dtype == torch.bfloat16:  # NOTE: numpy has no bfloat16
                return ('tensor', 'bfloat16', tensor.view(torch.int16).numpy())
            return ('tensor', None, tensor.numpy())
        return None

    def reducer_override(self, obj: Any) -> Any:
        import numpy as np
        import torch
        if isinstance(obj, (np.ndarray, np.generic, np.dtype, torch.dtype, torch.device,
                            torch.Size)):
            return NotImplemented
        named = obj if isinstance(obj, type) or callable(obj) else type(obj)
        module = getattr(named, '__module__', None) or ''
        name = getattr(named, '__qualname__', getattr(named, '__name__', ''))
        if _allowed(module, name) is None:
            raise PredictionsPicklingError(
                f'{module}.{name} is not allowed in a predictions file (only numbers, arrays, '
                'tensors, containers and OpenMMLab data structures are)')
        return NotImplemented


class _PredictionsUnpickler(pickle.Unpickler):
    """Loads a predictions file's payload.

    The allow-listed globals only (anything else is an ``UnpicklingError`` that names it), tensors
    from their arrays.
    """

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed(module, name)
        if found is None:
            raise pickle.UnpicklingError(
                f'{module}.{name} is not allowed in a predictions file (only numbers, arrays, '
                'tensors, containers and OpenMMLab data structures are)')
        return found

    def persistent_load(self, pid: Any) -> Any:
        import torch
        kind, dtype, array = pid
        if kind != 'tensor':
            raise pickle.UnpicklingError(f'unknown persistent id {kind!r}')
        if not array.flags.writeable:
            array = array.copy()
        tensor = torch.from_numpy(array)
        return tensor.view(torch.bfloat16) if dtype == 'bfloat16' else tensor


def save_cell_predictions(path: str, identity_sha256: str, corruption: str, severity: int,
                          parts: Sequence[list], dataset_meta: Optional[Mapping],
                          timing: Mapping) -> None:
    """Write a cell's gathered metric inputs atomically (flushed to disk before it is used).

    A one-line header (:func:`read_predictions_header`), then the payload.
    """
    header = {'format': PREDICTIONS_FORMAT, 'identity_sha256': identity_sha256,
              'cell': [corruption, int(severity)]}
    payload = {'parts': list(parts), 'dataset_meta': dict(dataset_meta or {}),
               'timing': dict(timing)}
    with atomic_write(path, 'wb') as f:
        f.write(json.dumps(header).encode() + b'\n')
        # NOTE: protocol 4: numpy arrays through _reconstruct, which the allow-list has
        _PredictionsPickler(f, protocol=4).dump(payload)


def read_predictions_header(path: str) -> Dict[str, Any]:
    """The header of a predictions file (format, identity fingerprint, cell).

    Read without unpickling anything.

    Raises:
        ValueError: not a predictions file of :data:`PREDICTIONS_FORMAT` (e.g. an earlier
            mmrobust's, in the general pickle format).
    """
    with open(path, 'rb') as f:
        line = f.readline(1 << 16)
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get('format') != PREDICTIONS_FORMAT:
        raise ValueError(f'{path} is not a predictions file of {PREDICTIONS_FORMAT} (an '
                         'earlier mmrobust\'s, or another file)')
    return header


def load_cell_predictions(path: str) -> Dict:
    """A predictions file this package wrote, as a dict (the header's keys and the payload's).

    Loaded by a restricted unpickler.

    Raises:
        ValueError: not a predictions file of :data:`PREDICTIONS_FORMAT`.
        pickle.UnpicklingError: the payload names anything but numbers, arrays, tensors and
            containers (nothing of it ran).
    """
    header = read_predictions_header(path)
    with open(path, 'rb') as f:
        f.readline(1 << 16)
        payload = _PredictionsUnpickler(f).load()
    if not isinstance(payload, dict) or 'parts' not in payload:
        raise ValueError(f'{path} holds no predictions payload')
    return {**header, **payload}


def saved_cells(folder: str, identity_sha256: str,
                planned: Optional[Sequence[Tuple[str, int]]] = None
                ) -> Tuple[Dict[Tuple[str, int], str], List[str]]:
    """The predictions files in ``folder``, from their headers alone.

    ``({(corruption, severity): path}, unused)``, where ``unused`` lists files that must not be
    used: of another evaluation, unreadable, or of a cell that is not in ``planned`` (orphans); the
    log says why for each.
    """
    found: Dict[Tuple[str, int], str] = {}
    unused: List[str] = []
    if not osp.isdir(folder):
        return found, unused
    wanted = None if planned is None else {(c, int(s)) for c, s in planned}
    for name in sorted(os.listdir(folder)):
        path = osp.join(folder, name)
        if TMP_MARK in name or not name.endswith('.pkl'):
            continue
        try:
            header = read_predictions_header(path)
        except (OSError, ValueError) as err:
            print_log(f'{path} cannot be used ({err}); its cell is inferred again',
                      logger='current', level=30)
            unused.append(path)
            continue
        if header['identity_sha256'] != identity_sha256:
            print_log(f'{path}: predictions of another evaluation', logger='current', level=30)
            unused.append(path)
            continue
        corruption, severity = header['cell']
        cell = (corruption, int(severity))
        if wanted is not None and cell not in wanted:
            print_log(f'{path}: predictions of cell {cell[0]} {cell[1]}, which this evaluation '
                      'does not plan (an orphan)', logger='current', level=30)
            unused.append(path)
            continue
        found[cell] = path
    return found, unused
