"""Where the test suite's time goes, from a pytest log: the table in CONTRIBUTING.md's CI section.

Run the suite with every duration and the workers' lines, then summarise::

    python -m pytest tests -n 2 --dist loadgroup -v --durations=0 > suite.log 2>&1
    python tools/analysis_tools/suite_durations.py suite.log --top 40

Prints Markdown: the wall time, the sum of the tests' times and each pytest-xdist worker's share
(a worker that finishes early idles while the other runs: the wall time is the busier worker's),
the ``--top`` slowest phases (``setup`` is the test's fixtures: a session fixture's cost lands on
the first test that asks for it, ``@group`` names its pytest-xdist group) and the files by total.
"""
import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import InputNotFoundError, UsageError, run_tool  # noqa: E402

_DURATION = re.compile(r'^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+)')
_WORKER = re.compile(r'^\[(gw\d+)\] \[\s*\d+%\] (?:PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) '
                     r'(\S+)')
_WALL = re.compile(r' in (\d+(?:\.\d+)?)s\b')
_COUNTS = re.compile(r'(\d+) (passed|failed|skipped|errors?|deselected)')


def _test_id(nodeid: str) -> str:
    return nodeid.split('@')[0]  # NOTE: xdist appends @<group> to a grouped test's node id


def parse(text: str) -> Tuple[List[Tuple[float, str, str]], Dict[str, str], Optional[float],
                              Dict[str, int]]:
    """``(durations, worker of each test, wall seconds, outcome counts)`` of a pytest log."""
    durations, workers, wall, counts = [], {}, None, {}
    for line in text.splitlines():
        if match := _DURATION.match(line):
            durations.append((float(match[1]), match[2], match[3]))
        elif match := _WORKER.match(line):
            workers[_test_id(match[2])] = match[1]
        elif _COUNTS.search(line) and (match := _WALL.search(line)):
            wall = float(match[1])
            counts = {kind: int(n) for n, kind in _COUNTS.findall(line)}
    return durations, workers, wall, counts


def report(text: str, top: int = 40) -> str:
    """The Markdown summary of a pytest log (see the module's docstring)."""
    durations, workers, wall, counts = parse(text)
    if not durations:
        raise UsageError('no durations in the log: run pytest with --durations=0 (and -v for the '
                         'workers\' shares)')
    total = sum(d for d, _, _ in durations)
    busy: Dict[str, float] = defaultdict(float)
    per_file: Dict[str, float] = defaultdict(float)
    for seconds, _, nodeid in durations:
        busy[workers.get(_test_id(nodeid), '?')] += seconds
        per_file[nodeid.split('::')[0]] += seconds
    lines = [f'tests: {", ".join(f"{n} {k}" for k, n in counts.items()) or "?"}; wall '
             f'{wall if wall is not None else "?"} s; the tests\' own time {total:.0f} s']
    if workers:
        lines.append('per worker: ' + ', '.join(f'{w} {s:.0f} s' for w, s in sorted(busy.items())))
    lines += ['', '| s | phase | test |', '|---:|---|---|']
    for seconds, phase, nodeid in sorted(durations, reverse=True)[:top]:
        lines.append(f'| {seconds:.1f} | {phase} | `{nodeid}` |')
    lines += ['', '| s | file |', '|---:|---|']
    for path, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f'| {seconds:.0f} | `{path}` |')
    return '\n'.join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    """The command line: print :func:`report` of a saved pytest log."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('log', type=Path, help='pytest output with --durations=0 (and -v)')
    parser.add_argument('--top', type=int, default=40, help='rows per table (default: 40)')
    args = parser.parse_args(argv)
    if not args.log.is_file():
        raise InputNotFoundError(f'{args.log} is not a file: give the saved pytest output')
    print(report(args.log.read_text(errors='replace'), args.top))


if __name__ == '__main__':
    run_tool(main)
