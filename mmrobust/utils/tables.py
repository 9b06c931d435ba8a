"""Tables of named rows that code and users extend: attack families, cell kinds."""
from typing import Any, Dict, TypeVar

__all__ = ['RowTable']

Row = TypeVar('Row')


class RowTable(Dict[str, Any]):
    """Rows by their ``name``, in the order they were added.

    Args:
        what: what a row is, for the error on a second row of one name (``attack family``).
    """

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def add(self, row: Row, force: bool = False) -> Row:
        """Add ``row`` under ``row.name`` (``force``: replace a row of that name)."""
        if row.name in self and not force:
            raise ValueError(f'{self.what} {row.name!r} is registered already (force=True '
                             'replaces it)')
        self[row.name] = row
        return row
