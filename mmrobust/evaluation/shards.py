"""A robustness run split into shards of cells (``--shard I/N``), and the shards merged back.

Each shard evaluates every N-th planned cell into a results file of its own (its identity
records the shard); :func:`merge_results` joins the files of one evaluation into the results
of an unsharded run (``tools/robustness_report.py merge``).
"""
from typing import Dict, List, Mapping, Sequence, Tuple

from ..utils.errors import MMRobustError, UsageError
from .results import IDENTITY_KEYS, SHIFTS_KEY, identity_keys, planned_cells

__all__ = ['ShardError', 'ShardSpecError', 'merge_results', 'parse_shard', 'shard_cells']


class ShardError(MMRobustError, ValueError):
    """Shard results that cannot be merged, or a malformed ``--shard`` (the message says why)."""


class ShardSpecError(UsageError, ShardError):
    """A malformed ``--shard`` (a usage error: exit status 2)."""


def parse_shard(text: str) -> Tuple[int, int]:
    """``'i/n'`` as ``(i, n)`` with ``0 <= i < n``."""
    try:
        index, count = (int(part) for part in text.split('/'))
    except ValueError:
        raise ShardSpecError(f'--shard takes I/N (the I-th of N shards, from 0), got {text!r}') \
            from None
    if count < 1 or not 0 <= index < count:
        raise ShardSpecError(f'--shard {text}: I must be in 0..N-1 and N at least 1')
    return index, count


def shard_cells(cells: Sequence[Tuple[str, int]], index: int, count: int
                ) -> List[Tuple[str, int]]:
    """The cells of shard ``index`` of ``count``.

    Every ``count``-th cell of ``cells`` (the clean set first), so shards differ by one cell at most
    and each mixes corruptions and severities.
    """
    return [cell for k, cell in enumerate(cells) if k % count == index]


def merge_results(shards: Sequence[Tuple[str, Mapping]], allow_missing: bool = False) -> Dict:
    """One results dict from the results of several shards (``[(path, data), ...]``).

    The merged dict resumes and reports like an unsharded run's: its identity is the shards'
    (without ``shard``), its cells and timings their union.

    Raises:
        ShardError: the shards evaluated different things (the differing keys are listed per
            file), a cell has different numbers in two shards, or cells are missing and
            ``allow_missing`` is False (they are listed).
    """
    if not shards:
        raise ShardError('no shard results to merge')
    first_path, first = shards[0]
    keys = ('format', ) + tuple(k for k in IDENTITY_KEYS if k != 'shard') + (SHIFTS_KEY, )
    problems = []
    for path, data in shards[1:]:
        if identity_keys(data) != identity_keys(first):
            problems.append(f'identity_keys: {first_path} has {list(identity_keys(first))}, '
                            f'{path} {list(identity_keys(data))} (written by different '
                            'mmrobust versions)')
        diff = [f'{k}: {first_path} has {first.get(k)!r}, {path} {data.get(k)!r}'
                for k in keys if data.get(k) != first.get(k)]
        problems += diff
    if problems:
        raise ShardError('the shards evaluated different things; refusing to merge them:\n  '
                         + '\n  '.join(problems))
    cells: Dict[str, Dict[str, Dict]] = {}
    timing: Dict[str, Dict[str, Dict]] = {}
    owner: Dict[Tuple[str, str], str] = {}
    conflicts = []
    for path, data in shards:
        for corruption, by_severity in data.get('cells', {}).items():
            for severity, metrics in by_severity.items():
                key = (corruption, str(severity))
                if key in owner and cells[corruption][str(severity)] != metrics:
                    conflicts.append(f'{corruption} {severity}: {owner[key]} and {path}')
                    continue
                owner.setdefault(key, path)
                cells.setdefault(corruption, {})[str(severity)] = metrics
                shard_timing = data.get('timing', {}).get(corruption, {}).get(str(severity))
                if shard_timing is not None:
                    timing.setdefault(corruption, {})[str(severity)] = shard_timing
    if conflicts:
        raise ShardError('cells with different numbers in two shards (evaluated twice, '
                         'differently); refusing to merge:\n  ' + '\n  '.join(conflicts))
    planned = planned_cells(first)
    missing = [f'{c} {s}' for c, s in planned if str(s) not in cells.get(c, {})]
    merged = {k: v for k, v in first.items()
              if k not in ('cells', 'timing', 'shard', 'time', 'created', 'updated')}
    merged.update(cells=cells, timing=timing, merged_from=[
        {'path': path, 'shard': data.get('shard')} for path, data in shards])
    if missing:
        if not allow_missing:
            raise ShardError(f'{len(missing)} cell(s) of the protocol are in no shard: '
                             f'{", ".join(missing)}. Run the shards that hold them (or merge '
                             'what there is with --allow-missing, marked as partial).')
        merged['partial'] = {'missing': missing}
    return merged
