"""The built-in cell kinds, registered in run order: the one list.

The clean set first (it rides with the corruptions' one pass), then the corruptions, the
attacks (their worst case computed from them) and the real-world shift sets. A kind from a
user's module registers after these (:func:`~.register_cell_kind`, from a module the config's
``custom_imports`` names).
"""
from typing import Tuple

from . import CellKind, register_cell_kind
from .attack import ATTACK
from .corruption import CLEAN_SET, CORRUPTION
from .shift import SHIFT

__all__ = ['BUILTIN_KINDS']

#: the built-in kinds, in run order
BUILTIN_KINDS: Tuple[CellKind, ...] = (CLEAN_SET, CORRUPTION, ATTACK, SHIFT)

for _kind in BUILTIN_KINDS:
    register_cell_kind(_kind)
