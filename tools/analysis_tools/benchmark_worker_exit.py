"""How soon the metric worker is gone after its run's process is killed (``kill -9``).

    python tools/analysis_tools/benchmark_worker_exit.py            # 3 rounds, both moments

A small process stands in for the robustness run: it starts a :class:`MetricWorker` as mmrobust
does (from the process's fork server) or, as the baseline, as mmrobust did before (``spawn``),
hands it a cell, and is killed with ``SIGKILL`` at one of two moments:

- ``start-up``: right after the hand-over, the worker still starting (the first worker of a
  process: the fork server imports mmrobust and the metrics' modules first);
- ``metric``: 10 s later, the worker holding the cell (it sleeps in place of a metric:
  ``MMROBUST_METRIC_WORKER_DELAY_S``).

The figures are the seconds from the kill until the worker is gone, and until every process
the killed one started is gone (the fork server too: it holds no device and no file of the
run, but a Python with torch imported takes a moment to shut down), per start method and
moment, the cases interleaved round by round (median and range), with the ratio of the fork
server's to spawn's.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import os
import signal
import subprocess
import tempfile
import time
from typing import Callable, Dict, List

from mmrobust.utils.benchmark import fmt_range, interleave, ratio_summary, summary

REPO = Path(__file__).resolve().parents[2]
METHODS = ('fork server', 'spawn')
MOMENTS = ('start-up', 'metric')
#: seconds the stand-in run waits before the ``metric`` kill: spawn's worker imports first
METRIC_AFTER_S = 10.0

# the stand-in run: start a worker, hand it a cell, say the worker's pid, wait to be killed
_RUN = '''
import os, sys, time
sys.path.insert(0, sys.argv[4])
method, moment, folder = sys.argv[1:4]
from mmrobust.evaluation import metric_worker as mw
from mmrobust.evaluation.predictions_file import predictions_path, save_cell_predictions
if method == 'spawn':
    import multiprocessing
    mw._context = lambda imports: multiprocessing.get_context('spawn')
if moment == 'metric':
    os.environ[mw.DELAY_ENV] = '600'
path = predictions_path(folder, 'probe', 1)
save_cell_predictions(path, 'id', 'probe', 1, [[{}]], {}, {})
worker = mw.MetricWorker(None, ['mmrobust'])
worker.submit(path, [dict(type='IoUMetric')])
print(worker._proc.pid, flush=True)
time.sleep(600)
'''


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--moments', nargs='+', choices=MOMENTS, default=list(MOMENTS))
    return parser.parse_args()


def _children(pid: int) -> List[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    parents: Dict[int, int] = {}
    for entry in os.scandir('/proc'):
        if entry.name.isdigit():
            try:
                with open(f'/proc/{entry.name}/stat', 'rb') as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rindex(b')') + 2:].split()
            if fields[0] not in (b'Z', b'X'):
                parents[int(entry.name)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids = [p for p, q in parents.items() if q == parent]
        found += kids
        todo += kids
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f'/proc/{pid}/stat', 'rb') as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b')') + 2:].split()[0] not in (b'Z', b'X')


def _step(method: str, moment: str, folder: str, every: List[float]) -> Callable[[], float]:
    """One kill: returns the seconds until the worker is gone; appends those until all are."""
    def step() -> float:
        run = subprocess.Popen([sys.executable, '-c', _RUN, method, moment, folder, str(REPO)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            worker = int(run.stdout.readline())
            if moment == 'metric':
                time.sleep(METRIC_AFTER_S)
            left = set(_children(run.pid)) | {worker}
            os.kill(run.pid, signal.SIGKILL)
            start = time.perf_counter()
            worker_gone = None
            while any(_alive(p) for p in left):
                if worker_gone is None and not _alive(worker):
                    worker_gone = time.perf_counter() - start
                if time.perf_counter() - start > 120:
                    raise RuntimeError(f'{method}: processes {sorted(left)} alive 120 s after '
                                       'their run was killed')
                time.sleep(0.01)
            every.append(time.perf_counter() - start)
            return worker_gone if worker_gone is not None else every[-1]
        finally:
            run.kill()
            run.wait()
    return step


def main() -> None:
    """Kill stand-in runs at each moment, both start methods interleaved; print the table."""
    args = parse_args()
    if not os.path.isdir('/proc'):
        raise SystemExit('this benchmark reads /proc (Linux)')
    with tempfile.TemporaryDirectory() as folder:
        print('| moment | gone | fork server (s) | spawn (s) | fork server / spawn |')
        print('|---|---|---|---|---|')
        for moment in args.moments:
            every: Dict[str, List[float]] = {m: [] for m in METHODS}
            worker = interleave({m: _step(m, moment, folder, every[m]) for m in METHODS},
                                args.rounds, warmup=0)
            for what, times in (('the worker', worker), ('every process', every)):
                fork, spawn = times['fork server'], times['spawn']
                print(f'| {moment} | {what} | {fmt_range(summary(fork))} | '
                      f'{fmt_range(summary(spawn))} | '
                      f'{fmt_range(ratio_summary(fork, spawn), ".3f")} |')
    print(f'\n{args.rounds} round(s) of each case, interleaved; median (range); '
          f'"metric": killed {METRIC_AFTER_S:g} s after the hand-over')


if __name__ == '__main__':
    run_tool(main)
