"""The COCO metric of one robustness cell with each COCO library, on the same predictions.

    python tools/analysis_tools/benchmark_coco_metric.py                  # 500 images, ~3 min
    python tools/analysis_tools/benchmark_coco_metric.py --n 5000 --rounds 2   # COCO val scale

A synthetic COCO-format set (640x480, ~7 objects per image over 80 classes, polygon masks, a
crowd region in 5 % of the images) and 100 detections per image with masks. One step of a
backend is what mmdet's CocoMetric does for a cell after inference, for bbox and for segm:
parse the ground truth, ``loadRes``, ``evaluate``, ``accumulate``, ``summarize``. The backends
take their steps in turn (interleaved; ratios are the median and range of per-round ratios to
pycocotools), and the first round checks that every backend's 12 numbers equal pycocotools'.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
from typing import Dict, List

import numpy as np

from mmrobust.datasets.synthetic_coco import (
    detections_to_coco_results,
    synthetic_coco_gt,
    synthetic_detections,
)
from mmrobust.evaluation.coco_metric import COCO_BACKENDS, coco_backend
from mmrobust.utils.benchmark import fmt_range, interleave, ratio_summary, summary


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--n', type=int, default=500, help='images (default 500)')
    parser.add_argument('--per-image', type=int, default=100, help='detections per image')
    parser.add_argument('--classes', type=int, default=80)
    parser.add_argument('--iou-types', nargs='+', default=['bbox', 'segm'],
                        choices=['bbox', 'segm'])
    parser.add_argument('--backends', nargs='+', default=list(COCO_BACKENDS),
                        choices=list(COCO_BACKENDS), help='pycocotools is always included')
    parser.add_argument('--rounds', type=int, default=3, help='timed rounds (default 3)')
    parser.add_argument('--seed', type=int, default=0)
    return parser.parse_args()


def evaluate(backend: str, gt_file: str, results: Dict[str, List[Dict]]) -> np.ndarray:
    """One cell's metric: bbox and segm stats (12 each), as mmdet's CocoMetric sets it up."""
    lib = coco_backend(backend)
    stats = []
    # the libraries print their tables and progress bars
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for iou_type, dets in results.items():
            gt = lib.coco(gt_file)
            # NOTE: loadRes adds keys to the detections (a segm 'bbox' array that the other
            # library then refuses): each gets fresh dicts, as from mmdet's results JSON
            evaluator = lib.cocoeval(gt, gt.loadRes([dict(d) for d in dets]), iou_type)
            evaluator.params.maxDets = [100, 300, 1000]
            evaluator.evaluate()
            evaluator.accumulate()
            evaluator.summarize()
            stats.append(np.asarray(evaluator.stats[:12], np.float64))
    return np.concatenate(stats)


def main() -> None:
    args = parse_args()
    backends = ['pycocotools'] + [b for b in args.backends if b != 'pycocotools']
    labels = {b: coco_backend(b).label for b in backends}  # a missing one stops here
    print(f'{args.n} images, {args.per_image} detections each, {args.classes} classes, '
          f'{", ".join(args.iou_types)}; {os.cpu_count()} CPUs, load average '
          f'{os.getloadavg()[0]:.2f}; {", ".join(labels.values())}', flush=True)
    start = time.perf_counter()
    gt = synthetic_coco_gt(args.n, args.classes, crowd_prob=0.05, seed=args.seed)
    dets = synthetic_detections(gt, per_image=args.per_image, seed=args.seed)
    results = {t: detections_to_coco_results(dets, gt, t) for t in args.iou_types}
    print(f'synthetic set: {len(gt["annotations"])} objects, '
          f'{sum(len(r) for r in results.values())} detections in '
          f'{time.perf_counter() - start:.0f} s', flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        gt_file = os.path.join(tmp, 'gt.json')
        with open(gt_file, 'w') as f:
            json.dump(gt, f)
        stats: Dict[str, np.ndarray] = {}

        def step(backend):
            def run():
                out = evaluate(backend, gt_file, results)
                stats.setdefault(backend, out)
            return run

        times = interleave({b: step(b) for b in backends}, rounds=args.rounds, warmup=0)

    print(f'\n| backend | s per cell ({args.rounds} rounds) | ms per image | pycocotools / '
          f'backend | max |stat - pycocotools| |')
    print('|---|---|---|---|---|')
    for b in backends:
        per_cell = summary(times[b])
        per_image = {k: v * 1000 / args.n for k, v in per_cell.items()}
        ratio = ratio_summary(times['pycocotools'], times[b])
        diff = float(np.abs(stats[b] - stats['pycocotools']).max())
        print(f'| {labels[b]} | {fmt_range(per_cell, ".1f")} | {fmt_range(per_image, ".1f")} | '
              f'{fmt_range(ratio)}x | {diff:.1e} |')
    print(f'\nat 5,000 images a cell costs about 5000 x (ms per image); load average now '
          f'{os.getloadavg()[0]:.2f}')
    worst = max(float(np.abs(stats[b] - stats['pycocotools']).max()) for b in backends)
    if worst > 1e-4:
        raise SystemExit(f'the backends disagree with pycocotools by up to {worst:.1e}')


if __name__ == '__main__':
    main()
