"""The COCO metric of one robustness cell with each COCO library, on the same predictions.

    python tools/analysis_tools/benchmark_coco_metric.py                  # 500 images, ~3 min
    python tools/analysis_tools/benchmark_coco_metric.py --n 5000 --rounds 2   # COCO val scale

A synthetic COCO-format set (640x480, ~7 objects per image over 80 classes, polygon masks, a
crowd region in 5 % of the images) and 100 detections per image with masks. One step of a
backend is what mmdet's CocoMetric does for a cell after inference, for bbox and for segm:
parse the ground truth, ``loadRes``, ``evaluate``, ``accumulate``, ``summarize``. The backends
take their steps in turn (interleaved; ratios are the median and range of per-round ratios to
pycocotools), and the first round checks that every backend's 12 numbers equal pycocotools'.

Before that, the part of the metric inside the test loop: run-length encoding each image's masks
(``--per-image`` full-size masks, ellipses in the detections' boxes, as a Mask R-CNN pastes them),
mmdet's ``encode_mask_results`` against mmrobust's ``encode_masks`` on the host and its device path
(``device_runs``: run boundaries by tensor ops where the masks are, ``--device``, default cuda when
there is one, else the CPU), interleaved, checked identical.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import run_tool
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
    synthetic_coco_cell,
    synthetic_coco_parser,
)
from mmrobust.evaluation.coco_metric import COCO_BACKENDS, coco_backend
from mmrobust.utils.benchmark import (
    fmt_range,
    interleave,
    ratio_summary,
    summary,
)


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = synthetic_coco_parser(__doc__)
    parser.add_argument('--iou-types', nargs='+', default=['bbox', 'segm'],
                        choices=['bbox', 'segm'])
    parser.add_argument('--backends', nargs='+', default=list(COCO_BACKENDS),
                        choices=list(COCO_BACKENDS), help='pycocotools is always included')
    parser.add_argument('--encode-images', type=int, default=20,
                        help='images whose masks are encoded per round (default 20)')
    parser.add_argument('--device', default=None,
                        help='device of the device-path RLE (default: cuda if there is one)')
    return parser.parse_args()


def instance_masks(dets: List[Dict], gt: Dict, images: int) -> List[np.ndarray]:
    """Full-size bool masks of the first ``images`` images' detections: an ellipse in each box."""
    import cv2
    sizes = {img['id']: (img['height'], img['width']) for img in gt['images']}
    out = []
    for d in dets[:images]:
        h, w = sizes[d['img_id']]
        masks = np.zeros((len(d['bboxes']), h, w), np.uint8)
        for mask, (x1, y1, x2, y2) in zip(masks, d['bboxes']):
            cv2.ellipse(mask, (int((x1 + x2) / 2), int((y1 + y2) / 2)),
                        (max(1, int((x2 - x1) / 2)), max(1, int((y2 - y1) / 2))), 0, 0, 360, 1,
                        -1)
        out.append(masks.astype(bool))
    return out


def benchmark_encoding(masks: List[np.ndarray], rounds: int, device: str) -> None:
    """mmdet's per-mask RLE against :func:`encode_masks` on the host and on ``device``.

    :func:`device_runs`. Interleaved; identical output.
    """
    import torch
    from mmdet.structures.mask import encode_mask_results

    from mmrobust.evaluation.mask_rle import device_runs, encode_masks, rle_strings
    tensors = [torch.from_numpy(m) for m in masks]  # NOTE: what process() receives
    on_device = [t.to(device) for t in tensors]

    def by_device(t):
        strings = rle_strings(device_runs(t))
        return [{'size': list(t.shape[1:]), 'counts': c} for c in strings]
    if any(encode_masks(t) != encode_mask_results(t.numpy()) or by_device(d) != encode_masks(t)
           for t, d in zip(tensors, on_device)):
        raise SystemExit('encode_masks differs from pycocotools')
    # NOTE: mmdet and the host path get host masks, as after the model's own copy to the host
    # (on a GPU that copy is theirs to pay besides, ~30 MB per image); the device path gets
    # the masks where the model left them
    cases = {'mmdet encode_mask_results': lambda: [encode_mask_results(t.detach().cpu().numpy())
                                                   for t in tensors],
             'mmrobust encode_masks': lambda: [encode_masks(t) for t in tensors],
             f'mmrobust device_runs ({device})': lambda: [by_device(t) for t in on_device]}
    times = interleave(cases, rounds=rounds, warmup=1)
    n = len(masks)
    print(f'\n| mask RLE in the loop ({n} images x {len(masks[0])} masks of '
          f'{masks[0].shape[1]}x{masks[0].shape[2]}) | ms per image | mmdet / this |')
    print('|---|---|---|')
    base = times['mmdet encode_mask_results']
    for name, values in times.items():
        per_image = {k: v * 1000 / n for k, v in summary(values).items()}
        print(f'| {name} | {fmt_range(per_image, ".1f")} | '
              f'{fmt_range(ratio_summary(base, values))}x |', flush=True)


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
    """Time mask encoding and every COCO backend; print the tables."""
    args = parse_args()
    if args.device is None:
        import torch
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    backends = ['pycocotools'] + [b for b in args.backends if b != 'pycocotools']
    labels = {b: coco_backend(b).label for b in backends}  # a missing one stops here
    print(f'{args.n} images, {args.per_image} detections each, {args.classes} classes, '
          f'{", ".join(args.iou_types)}; {os.cpu_count()} CPUs, load average '
          f'{os.getloadavg()[0]:.2f}; {", ".join(labels.values())}', flush=True)
    start = time.perf_counter()
    gt, dets = synthetic_coco_cell(args)
    results = {t: detections_to_coco_results(dets, gt, t) for t in args.iou_types}
    print(f'synthetic set: {len(gt["annotations"])} objects, '
          f'{sum(len(r) for r in results.values())} detections in '
          f'{time.perf_counter() - start:.0f} s', flush=True)
    if args.encode_images and 'segm' in args.iou_types:
        benchmark_encoding(instance_masks(dets, gt, args.encode_images), args.rounds,
                           args.device)

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
    run_tool(main)
