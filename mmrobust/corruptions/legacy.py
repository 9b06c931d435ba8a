"""Fast drop-ins for ``RandomState.poisson`` / ``RandomState.normal`` (same numbers, same state).

The noise corruptions must draw what the reference draws from NumPy's legacy generator, whose
C loops are the noise corruptions' main cost. These run the same MT19937 stream and the same
algorithms in compiled code and hand the advanced state back to the ``RandomState``.
"""
from typing import Tuple, Union

import numpy as np

from . import _kernels


def _state(rng: np.random.RandomState):
    name, key, pos, has_gauss, cached = rng.get_state()
    assert name == 'MT19937'
    return key.astype(np.uint32, copy=True), np.array([pos], dtype=np.int64), \
        np.array([float(has_gauss), cached], dtype=np.float64)


def _store(rng: np.random.RandomState, key: np.ndarray, pos: np.ndarray, gauss: np.ndarray
           ) -> None:
    rng.set_state(('MT19937', key, int(pos[0]), int(gauss[0] != 0.0), float(gauss[1])))


def poisson(rng: np.random.RandomState, index: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``rng.poisson(table[index])``.

    ``index`` an integer array (e.g. a uint8 image), ``table`` the float64 rates (finite, in [0,
    1e7)) of its values.
    """
    table = np.ascontiguousarray(table, dtype=np.float64)
    if table.size and not (table.min() >= 0 and table.max() < 1e7):
        raise ValueError('poisson: rates must be finite, >= 0 and < 1e7')
    index = np.ascontiguousarray(index)
    if index.size and (index.min() < 0 or index.max() >= table.size):
        raise ValueError('poisson: index out of the table')
    key, pos, gauss = _state(rng)
    out = _kernels.legacy_poisson(key, pos, index.reshape(-1), table)
    _store(rng, key, pos, gauss)
    return out.reshape(index.shape)


def normal(rng: np.random.RandomState, size: Union[int, Tuple[int, ...]], loc: float = 0.0,
           scale: float = 1.0) -> np.ndarray:
    """``rng.normal(loc, scale, size)`` for scalar ``loc`` and ``scale``."""
    shape = (size, ) if isinstance(size, int) else tuple(size)
    key, pos, gauss = _state(rng)
    out = _kernels.legacy_normal(key, pos, gauss, int(np.prod(shape)), float(loc), float(scale))
    _store(rng, key, pos, gauss)
    return out.reshape(shape)
