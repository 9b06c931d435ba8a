"""What the robustness report's statistics cost: this checkout against another, interleaved.

    python tools/analysis_tools/benchmark_report.py --against ../mmrobust-759ecc6   # ~3 min
    python tools/analysis_tools/benchmark_report.py                # this checkout alone

Two recipes with three seeds each, on a COCO-C-shaped protocol (clean + 15 corruptions x 5
severities: 76 cells a results file, 6 files), with per-image IoU statistics (``--images``
images, 19 classes; the cheapest replicates there are, so the per-corruption tests' share of the
report is at its largest: with COCO AP, each cell's replicates cost ~2x its evaluation and
dominate further). Each round times, in alternating order,
:func:`~mmrobust.evaluation.report_stats.build_extras` (what ``tools/robustness_report.py``
computes before it writes) of this checkout and of ``--against`` (another mmrobust checkout,
e.g. a ``git worktree`` of the commit to compare with; each in a Python process of its own),
without and with ``--seed-bootstrap``.
Ratios are per round (median and range).
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import json
import os
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Tuple

import numpy as np

from mmrobust.corruptions import BENCHMARK_CORRUPTIONS
from mmrobust.evaluation.per_image import (
    IoUStats,
    iou_block,
    save_cell_stats,
    stats_dir,
    stats_path,
)
from mmrobust.evaluation.results import evaluation_sha256
from mmrobust.utils import benchmark as bench

CLASSES = 19
RECIPES = (('plain', 1.0), ('DAT', 1.04))


def write_runs(folder: str, images: int, seed: int) -> List[Tuple[str, str]]:
    """Six results files (two recipes x three seeds) with per-image side files: (label, path)."""
    rng = np.random.default_rng(seed)
    names = [f'img{i}' for i in range(images)]
    size = rng.gamma(2.0, 0.5, images)
    recall = rng.uniform(0.5, 0.9, CLASSES)
    cells = [('clean', 0)] + [(c, s) for c in BENCHMARK_CORRUPTIONS for s in range(1, 6)]
    gain = {c: rng.uniform(0.97, 1.05) for c in BENCHMARK_CORRUPTIONS}
    runs = []
    for recipe, factor in RECIPES:
        for k in range(3):
            identity = {'format': 'mmrobust-robustness/1', 'protocol': 'benchmark',
                        'cells_planned': {c: [1, 2, 3, 4, 5] for c in BENCHMARK_CORRUPTIONS},
                        'seed': 0, 'bgr_compat': False, 'source': 'on-the-fly',
                        'config_sha256': 'cfg', 'checkpoint_sha256': f'{recipe}{k}',
                        'shard': None}
            path = os.path.join(folder, f'{recipe}{k}.json')
            recorded: Dict[str, Dict[str, Any]] = {}
            seed_effect = rng.normal(1.0, 0.01)
            for corruption, severity in cells:
                p = recall * seed_effect * (1 - 0.12 * severity) * (
                    factor * gain.get(corruption, 1.0) if recipe != 'plain' else 1.0)
                label = rng.poisson(size[:, None] * 400, (images, CLASSES)).astype(float)
                inter = rng.binomial(label.astype(int), np.clip(p, 0, 1)).astype(float)
                pred = inter + rng.poisson(label * 0.2).astype(float)
                areas = [(inter[i], pred[i] + label[i] - inter[i], pred[i], label[i])
                         for i in range(images)]
                block = iou_block(areas, names, '')
                values = IoUStats(block).values(np.ones((1, images)))
                recorded.setdefault(corruption, {})[str(severity)] = {
                    m: float(v[0]) for m, v in values.items() if m in ('mIoU', 'aAcc')}
                save_cell_stats(stats_path(stats_dir(path), corruption, severity),
                                (corruption, severity), evaluation_sha256(identity), [block])
            with open(path, 'w') as f:
                json.dump({**identity, 'cells': recorded, 'timing': {}}, f)
            runs.append((recipe, path))
    return runs


#: the worker: the report's statistics step of the mmrobust at argv[1], once per stdin line
_WORKER = r"""
import json, sys, time
root, runs, replicates, seeds = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), \
    sys.argv[4] == '1'
sys.path.insert(0, root)
from mmrobust.evaluation import report_stats, results, uncertainty
assert report_stats.__file__.startswith(root), report_stats.__file__
labels = [f'{recipe} #{k % 3 + 1}' for k, (recipe, _) in enumerate(runs)]
entries = [(lb, path, results.load_results(path)) for lb, (_, path) in zip(labels, runs)]
groups = {}
for lb, (recipe, _) in zip(labels, runs):
    groups.setdefault(recipe, []).append(lb)
boot = uncertainty.Bootstrap(replicates, 0.95, 0)
print('READY', flush=True)
for _ in sys.stdin:
    start = time.perf_counter()
    report_stats.build_extras(entries, groups, boot, seed_bootstrap=seeds)
    print('TIME', time.perf_counter() - start, flush=True)
"""


class Worker:
    """One checkout's report statistics in its own Python process (each imports its mmrobust)."""

    def __init__(self, root: str, runs: List[Tuple[str, str]], replicates: int,
                 seeds: bool) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, '-c', _WORKER, root, json.dumps(runs), str(replicates),
             '1' if seeds else '0'], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._expect('READY')

    def _expect(self, tag: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(tag):
                return line[len(tag):].strip()
        raise RuntimeError(f'the benchmark worker ended (exit code {self.proc.wait()})')

    def step(self) -> float:
        """One build_extras in the worker: its seconds."""
        self.proc.stdin.write('step\n')
        self.proc.stdin.flush()
        return float(self._expect('TIME'))

    def close(self) -> None:
        """Stop the worker."""
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    """Time the report's statistics of both checkouts, interleaved; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--against', default=None, metavar='CHECKOUT',
                        help='another mmrobust checkout to time next to this one')
    parser.add_argument('--images', type=int, default=300, help='images a cell (default 300)')
    parser.add_argument('--replicates', type=int, default=1000,
                        help='bootstrap replicates (default 1000, the report\'s)')
    parser.add_argument('--rounds', type=int, default=3, help='timed rounds (default 3)')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parents[2])
    roots = {'this checkout': here}
    if args.against:
        against = os.path.abspath(args.against)
        if not os.path.isfile(os.path.join(against, 'mmrobust', 'evaluation', 'report_stats.py')):
            raise SystemExit(f'--against {args.against}: not an mmrobust checkout (no '
                             'mmrobust/evaluation/report_stats.py); make one with '
                             '`git worktree add ../mmrobust-old <commit>`')
        roots = {'--against': against, **roots}
    print(f'76 cells x 6 files, {args.images} images, {CLASSES} classes, {args.replicates} '
          f'replicates; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}',
          flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs = write_runs(tmp, args.images, args.seed)
        print(f'wrote the results files in {time.perf_counter() - start:.0f} s', flush=True)
        for seeds in (False, True):
            workers = {f'{name}{", --seed-bootstrap" if seeds else ""}':
                       Worker(root, runs, args.replicates, seeds)
                       for name, root in roots.items()}
            try:
                timed = bench.interleave({n: w.step for n, w in workers.items()},
                                         rounds=args.rounds, warmup=0)
            finally:
                for worker in workers.values():
                    worker.close()
            names = list(workers)
            base = timed[names[0]]
            print(f'\n| case | s ({args.rounds} rounds) | / {names[0]} |')
            print('|---|---|---|')
            for name in names:
                times = timed[name]
                print(f'| {name} | {bench.fmt_range(bench.summary(times))} | '
                      f'{bench.fmt_range(bench.ratio_summary(times, base))}x |', flush=True)
    print(f'\n{time.perf_counter() - start:.0f} s; load average now {os.getloadavg()[0]:.2f}')


if __name__ == '__main__':
    run_tool(main)
