"""What the overlapped test loop saves a plain COCO evaluation with mmdet's own tools/test.py.

    python tools/analysis_tools/benchmark_test_loop.py                 # N=300, 3 rounds, ~6 min
    python tools/analysis_tools/benchmark_test_loop.py --n 5000 --rounds 5   # COCO val's size

mmdet's ``tools/test.py`` (from the installed mmdet, in a process of its own, as a user runs it)
on a synthetic COCO-format val set (``--n`` images at 640x480, polygon masks; made once and kept
in ``--work-dir``) with a stub Mask R-CNN that sleeps a fixed latency per image (``--rate``: 20
images/s, one GPU) and returns 100 boxes with masks (``benchmark_robustness_eval.py``'s stub).
Two cases, interleaved round by round (A, B, B, A, ...):

- ``plain``: mmengine's ``TestLoop`` with mmdet's ``CocoMetric`` (the zoo configs' set-up);
- ``overlapped``: ``test_cfg=dict(type='mmrobust.OverlappedTestLoop')`` with
  ``mmrobust.RobustCocoMetric`` (``backend='faster-coco-eval'``).

Each run's test (from ``before_test`` to ``after_test``: the loop and the metric) is timed by a
hook; the process's wall time is printed beside it. The figure is overlapped / plain per round
(median and range), and each against the stub's latency alone (N / rate): the share of host
work and metric the loop did not hide. Both cases' metrics are printed: they must agree.
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
import os.path as osp
import re
import subprocess
import time
from typing import Dict, List

import torch
from mmdet.registry import HOOKS
from mmengine.hooks import Hook

from mmrobust.utils.benchmark import fmt_range, interleave, ratio_summary, summary
from mmrobust.utils.errors import InputNotFoundError

HERE = Path(__file__).resolve().parent
CASES = {
    'plain': (dict(type='TestLoop'), dict(type='CocoMetric')),
    'overlapped': (dict(type='mmrobust.OverlappedTestLoop'),
                   dict(type='mmrobust.RobustCocoMetric', backend='faster-coco-eval')),
}


@HOOKS.register_module(force=True)
class TestTimerHook(Hook):
    """Writes the seconds from ``before_test`` to ``after_test`` (loop and metric) to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.start = 0.0

    def before_test(self, runner) -> None:
        """Start the clock."""
        self.start = time.perf_counter()

    def after_test(self, runner) -> None:
        """Stop it and write the seconds."""
        with open(self.path, 'w') as f:
            f.write(str(time.perf_counter() - self.start))


def _mmdet_test_tool() -> Path:
    import mmdet
    tool = Path(mmdet.__file__).parent / '.mim' / 'tools' / 'test.py'
    if not tool.is_file():
        raise InputNotFoundError(f"mmdet's tools/test.py is not at {tool}: install mmdet from a "
                                 'wheel that ships its tools (pip install mmdet)')
    return tool


def write_config(root: str, work: str, case: str, rate: float, workers: int) -> str:
    """The case's config (stub, synthetic set, loop, metric), as a file for mmdet's tool."""
    from benchmark_robustness_eval import bench_config
    loop, metric = CASES[case]
    cfg = bench_config(root, work, rate, workers)
    cfg.test_cfg = loop
    cfg.test_evaluator = dict(metric, ann_file=cfg.test_evaluator['ann_file'],
                              metric=['bbox', 'segm'])
    cfg.custom_imports = dict(imports=['mmrobust', 'benchmark_robustness_eval',
                                       'benchmark_test_loop'], allow_failed_imports=False)
    cfg.custom_hooks = [dict(type='TestTimerHook', path=osp.join(work, f'{case}.seconds'))]
    path = osp.join(work, f'{case}.py')
    cfg.dump(path)
    return path


def run_case(tool: Path, config: str, checkpoint: str, work: str, case: str,
             walls: Dict[str, List[float]], metrics: Dict[str, Dict[str, str]]) -> float:
    """One run of mmdet's tools/test.py; returns the test's seconds (the hook's)."""
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(
        [str(HERE.parents[1]), str(HERE), os.environ.get('PYTHONPATH', '')])}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(tool), config, checkpoint, '--work-dir',
                           osp.join(work, case)], env=env, capture_output=True, text=True)
    walls[case].append(time.perf_counter() - start)
    if proc.returncode != 0:
        raise RuntimeError(f'{case}: mmdet tools/test.py failed:\n{proc.stderr[-4000:]}')
    metrics[case] = dict(re.findall(r'(coco/\w+_mAP): (-?[0-9.]+)', proc.stdout + proc.stderr))
    with open(osp.join(work, f'{case}.seconds')) as f:
        return float(f.read())


def main() -> None:
    """Time both cases interleaved; print the figures and the ratio."""
    from benchmark_robustness_eval import make_set
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--n', type=int, default=300, help='images (default 300)')
    parser.add_argument('--rate', type=float, default=20.0,
                        help="the stub's images/s (default 20: one GPU)")
    parser.add_argument('--rounds', type=int, default=3, help='timed rounds (default 3)')
    parser.add_argument('--workers', type=int, default=2, help='dataloader workers')
    parser.add_argument('--work-dir', default='work_dirs/benchmark_test_loop')
    parser.add_argument('--out', default=None, help='also write the figures to this JSON')
    args = parser.parse_args()
    tool = _mmdet_test_tool()
    work = osp.abspath(args.work_dir)
    os.makedirs(work, exist_ok=True)
    root = make_set(osp.join(work, 'coco'), args.n)
    configs = {case: write_config(root, work, case, args.rate, args.workers) for case in CASES}
    checkpoint = osp.join(work, 'stub.pth')  # NOTE: the stub has no weights; the tool wants one
    torch.save({'state_dict': {}, 'meta': {}}, checkpoint)
    walls: Dict[str, List[float]] = {case: [] for case in CASES}
    metrics: Dict[str, Dict[str, str]] = {}
    times = interleave({case: (lambda c=case: run_case(tool, configs[c], checkpoint, work, c,
                                                       walls, metrics)) for case in CASES},
                       rounds=args.rounds, warmup=0)
    latency = args.n / args.rate
    ratio = ratio_summary(times['overlapped'], times['plain'])
    print(f'mmdet tools/test.py, {args.n} images, stub at {args.rate:g} images/s (its latency '
          f'alone {latency:.1f} s), {args.workers} workers, {args.rounds} rounds interleaved; '
          f'{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} at the end')
    print('| case | test (loop + metric) s | x latency | process wall s | metrics |')
    print('|---|---|---|---|---|')
    for case in CASES:
        print(f'| {case} | {fmt_range(summary(times[case]), ".1f")} | '
              f'{summary(times[case])["median"] / latency:.2f}x | '
              f'{fmt_range(summary(walls[case]), ".1f")} | '
              f'{", ".join(f"{k}={v}" for k, v in sorted(metrics.get(case, {}).items()))} |')
    print(f'overlapped / plain (test seconds, round by round): {fmt_range(ratio)}')
    if metrics.get('plain') != metrics.get('overlapped'):
        print('WARNING: the two cases printed different metrics')
    if args.out:
        with open(args.out, 'w') as f:
            json.dump({'args': vars(args), 'test_s': times, 'wall_s': walls, 'ratio': ratio,
                       'metrics': metrics}, f, indent=1)


if __name__ == '__main__':
    run_tool(main)
