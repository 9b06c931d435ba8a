"""The kinds of cell a robustness evaluation has, each one object: clean, corruption, attack, shift.

A kind owns the names of its cells (each name is exactly one kind's) and says what the rest of
the evaluation asks of them: whether mPC averages over them, whether they are images of their
own (another test set, so that a per-image statistic pairs them only within the cell) and what a
report calls them. The kinds are registered in run order; :func:`kind_of` answers for a name.
A name no kind owns is an error, not a corruption: a new kind registers itself here
(CONTRIBUTING.md, recipes) instead of being counted in mPC by default.
"""
from dataclasses import dataclass
from typing import Callable, Dict

from ...corruptions.protocols import CORRUPTIONS
from ...datasets.shift_sets import SHIFT_SETS
from ...utils.errors import MMRobustError
from ...utils.tables import RowTable
from ..attack_families import ATTACK_FAMILIES

__all__ = ['ATTACK', 'CELL_KINDS', 'CLEAN', 'CLEAN_SET', 'CORRUPTION', 'SHIFT', 'WORST',
           'CellKind', 'UnknownCellError', 'counts_in_mpc', 'kind_of', 'register_cell_kind']

#: the clean test set's cell name (severity 0)
CLEAN = 'clean'
#: the per-image worst case over a run's attacks (:mod:`..worst_case`)
WORST = 'worst'


class UnknownCellError(MMRobustError, ValueError):
    """A cell name that no registered kind owns (or that two kinds claim)."""


@dataclass(frozen=True)
class CellKind:
    """One kind of cell.

    Args:
        name: the kind's name (``corruption``).
        owns: whether a cell name is one of this kind's.
        counts_in_mpc: mPC averages over its cells (the corruptions only).
        own_images: its cells are another image set than the clean test set's.
    """

    name: str
    owns: Callable[[str], bool]
    counts_in_mpc: bool = False
    own_images: bool = False


#: the kinds by name, in run order
CELL_KINDS: Dict[str, CellKind] = RowTable('cell kind')


def register_cell_kind(kind: CellKind, force: bool = False) -> CellKind:
    """Add ``kind`` to :data:`CELL_KINDS`, after those registered before it."""
    return CELL_KINDS.add(kind, force)


def kind_of(name: str) -> CellKind:
    """The kind a cell name is of.

    Raises:
        UnknownCellError: no kind, or more than one, owns ``name``.
    """
    owners = [k for k in CELL_KINDS.values() if k.owns(name)]
    if len(owners) != 1:
        raise UnknownCellError(
            f'cell {name!r} is {"no" if not owners else "more than one"} kind\'s '
            f'({", ".join(k.name for k in owners) or ", ".join(CELL_KINDS)}): a results file '
            'of a corruption, attack or shift set that this mmrobust does not know. Register '
            'what makes it (a corruption, an attack family, a shift set) before reading it')
    return owners[0]


def counts_in_mpc(name: str) -> bool:
    """Whether mPC averages over the cells of ``name``."""
    return kind_of(name).counts_in_mpc


def _is_attack(name: str) -> bool:
    family, _, norm = name.rpartition('_')
    return name == WORST or (family in ATTACK_FAMILIES and norm in ATTACK_FAMILIES[family].norms)


CLEAN_SET = register_cell_kind(CellKind('clean', lambda name: name == CLEAN))
CORRUPTION = register_cell_kind(CellKind('corruption', lambda name: name in CORRUPTIONS,
                                         counts_in_mpc=True))
ATTACK = register_cell_kind(CellKind('attack', _is_attack))
SHIFT = register_cell_kind(CellKind('shift', lambda name: name in SHIFT_SETS, own_images=True))
