"""What the bootstrap intervals of one COCO cell cost, next to the cell's evaluation.

    python tools/analysis_tools/benchmark_bootstrap.py                     # 500 images, ~1 min
    python tools/analysis_tools/benchmark_bootstrap.py --n 5000 --rounds 2  # COCO val scale

On a synthetic COCO-format set (as ``benchmark_coco_metric.py``: ~7 objects per image over 80
classes, 100 detections per image, mmdet's maxDets), per round and interleaved:

- ``evaluation``: one cell's bbox metric, as mmdet's CocoMetric runs it (``evaluate``,
  ``accumulate``, ``summarize``), with pycocotools and with faster-coco-eval (the default of
  robustness runs);
- ``per-image statistics``: what the metric keeps per cell for the bootstrap
  (:func:`~mmrobust.evaluation.per_image.coco_block`): pycocotools' evalImgs read out, or, under
  faster-coco-eval (which keeps them in C++), the per-image matching redone in Python from its
  IoUs;
- ``bootstrap``: ``--replicates`` replicates of the six AP numbers from those statistics (what
  ``tools/robustness_report.py`` does per cell, after the run).

Ratios are per round against the faster-coco-eval evaluation (median and range). The first
round checks that the statistics with unit weights give pycocotools' numbers; the size of the
cell's side file is printed.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import contextlib
import io
import json
import os
import tempfile
import time
from typing import Any, Dict

import numpy as np

from mmrobust.datasets.synthetic_coco import (
    detections_to_coco_results,
    synthetic_coco_cell,
    synthetic_coco_parser,
)
from mmrobust.evaluation.coco_metric import coco_backend
from mmrobust.evaluation.per_image import CocoAP, coco_block, save_cell_stats
from mmrobust.evaluation.uncertainty import bootstrap_weights
from mmrobust.utils import benchmark as bench


def evaluated(backend: str, gt_file: str, dets: list) -> Any:
    """A bbox COCOeval after evaluate / accumulate / summarize, as mmdet sets it up."""
    lib = coco_backend(backend)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        gt = lib.coco(gt_file)
        ev = lib.cocoeval(gt, gt.loadRes([dict(d) for d in dets]), 'bbox')
        ev.params.maxDets = [100, 300, 1000]
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev


def main() -> None:
    """Time one cell's evaluation, statistics and bootstrap; print the table."""
    parser = synthetic_coco_parser(__doc__)
    parser.add_argument('--replicates', type=int, default=200)
    args = parser.parse_args()
    print(f'{args.n} images, {args.per_image} detections each, {args.classes} classes, bbox, '
          f'{args.replicates} replicates; {os.cpu_count()} CPUs, load average '
          f'{os.getloadavg()[0]:.2f}', flush=True)
    gt, dets = synthetic_coco_cell(args)
    dets = detections_to_coco_results(
        dets, gt, 'bbox')
    weights = bootstrap_weights(args.n, args.replicates, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        gt_file = os.path.join(tmp, 'gt.json')
        with open(gt_file, 'w') as f:
            json.dump(gt, f)
        kept: Dict[str, Any] = {b: evaluated(b, gt_file, dets)
                                for b in ('pycocotools', 'faster-coco-eval')}
        block = coco_block(kept['pycocotools'], '')
        ap = CocoAP(block)
        ones = ap.values(np.ones((1, args.n)))
        got = np.array([ones[k][0] for k in ('mAP', 'mAP_50', 'mAP_75', 'mAP_s', 'mAP_m',
                                             'mAP_l')])
        worst = float(np.abs(got - kept['pycocotools'].stats[:6]).max())
        side = os.path.join(tmp, 'cell.npz')
        save_cell_stats(side, ('clean', 0), '', [block])
        print(f'per-image statistics: {len(block["score"])} detections kept, '
              f'{os.path.getsize(side) / 2**20:.1f} MiB on disk; unit weights differ from '
              f'pycocotools by {worst:.1e}', flush=True)
        if worst > 1e-12:
            raise SystemExit('the per-image statistics do not give pycocotools\' numbers')
        cases = {
            'evaluation, pycocotools': lambda: evaluated('pycocotools', gt_file, dets),
            'evaluation, faster-coco-eval': lambda: evaluated('faster-coco-eval', gt_file,
                                                              dets),
            'per-image statistics, pycocotools': lambda: coco_block(kept['pycocotools'], ''),
            'per-image statistics, faster-coco-eval': lambda: coco_block(
                kept['faster-coco-eval'], ''),
            f'bootstrap, {args.replicates} replicates': lambda: CocoAP(block).values(weights),
        }
        start = time.perf_counter()
        times = bench.interleave(cases, rounds=args.rounds, warmup=0)
    base = times['evaluation, faster-coco-eval']
    print(f'\n| step | s per cell ({args.rounds} rounds) | / faster-coco-eval evaluation |')
    print('|---|---|---|')
    for name, values in times.items():
        print(f'| {name} | {bench.fmt_range(bench.summary(values), ".2f")} | '
              f'{bench.fmt_range(bench.ratio_summary(values, base))}x |')
    print(f'\n{time.perf_counter() - start:.0f} s; load average now {os.getloadavg()[0]:.2f}')


if __name__ == '__main__':
    run_tool(main)
