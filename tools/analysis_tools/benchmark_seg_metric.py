"""What mmseg's IoUMetric (and FastIoUMetric) cost per Cityscapes-size image next to inference.

    python tools/analysis_tools/benchmark_seg_metric.py            # toy SegFormer, 2048x1024

One 2048x1024 image with a 19-class label map (ignore regions included) goes through the
config's test pipeline; one step of ``inference`` is ``model.test_step`` on it (forward and
mmseg's post-processing to the original size), one step of ``metric`` is ``IoUMetric.process``
on that prediction (the per-image work of a Cityscapes-C cell's metric; ``compute_metrics``
runs once per cell on 19x4 numbers). The two alternate (interleaved; the ratio is the median
and range of the per-round ratios).
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
import tempfile

import numpy as np
import torch
from mmengine.config import Config
from mmengine.dataset import Compose, pseudo_collate
from mmengine.registry import init_default_scope
from PIL import Image

from mmrobust.evaluation.seg_metric import FastIoUMetric
from mmrobust.utils.benchmark import fmt_range, interleave, ratio_summary, summary

DEFAULT_CONFIG = 'configs/toy/segformer_mit-b0_toy-cityscapes.py'


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', nargs='?', default=DEFAULT_CONFIG)
    parser.add_argument('--size', type=int, nargs=2, default=[2048, 1024], metavar=('W', 'H'))
    parser.add_argument('--rounds', type=int, default=10)
    return parser.parse_args()


def _label_map(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """Blocky regions of 19 classes and some ignore (255), like a Cityscapes label map."""
    blocks = rng.integers(0, 19, (h // 64 + 1, w // 64 + 1)).astype(np.uint8)
    labels = np.kron(blocks, np.ones((64, 64), np.uint8))[:h, :w]
    labels[rng.random((h, w)) < 0.05] = 255
    return labels


def main() -> None:
    """Time mmseg's IoUMetric and FastIoUMetric; print the table."""
    args = parse_args()
    from mmseg.evaluation import IoUMetric
    from mmseg.registry import MODELS

    cfg = Config.fromfile(args.config)
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    model = MODELS.build(cfg.model).eval()
    w, h = args.size
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        img_path, seg_path = os.path.join(tmp, 'img.png'), os.path.join(tmp, 'seg.png')
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(img_path)
        Image.fromarray(_label_map(h, w, rng)).save(seg_path)
        pipeline = Compose(cfg.test_dataloader.dataset.pipeline)
        sample = pipeline(dict(img_path=img_path, seg_map_path=seg_path, reduce_zero_label=False,
                               seg_fields=[]))
    batch = pseudo_collate([sample])
    with torch.no_grad():
        outputs = model.test_step(batch)
    predictions = [o.to_dict() for o in outputs]
    metrics = {'IoUMetric': IoUMetric(iou_metrics=['mIoU']),
               'FastIoUMetric': FastIoUMetric(iou_metrics=['mIoU'])}
    for metric in metrics.values():
        metric.dataset_meta = dict(classes=[str(i) for i in range(19)])

    def inference() -> None:
        with torch.no_grad():
            model.test_step(batch)

    def process(name):
        return lambda: metrics[name].process(batch, predictions)

    print(f'{args.config}: {w}x{h}, {torch.get_num_threads()} torch threads, {os.cpu_count()} '
          f'CPUs, load average {os.getloadavg()[0]:.2f}', flush=True)
    times = interleave({'inference': inference, **{n: process(n) for n in metrics}},
                       rounds=args.rounds)
    for name in times:
        print(f'{name:>13}: {fmt_range(summary([t * 1000 for t in times[name]]), ".1f")} ms '
              'per image')
    for name in metrics:
        share = {k: v * 100 for k, v in ratio_summary(times[name], times['inference']).items()}
        print(f'{name}.process / inference: {fmt_range(share, ".1f")} %')
    speedup = ratio_summary(times['IoUMetric'], times['FastIoUMetric'])
    print(f'IoUMetric / FastIoUMetric: {fmt_range(speedup)}x  (load average now '
          f'{os.getloadavg()[0]:.2f})')
    a, b = (m.results for m in metrics.values())
    assert all(torch.equal(x, y) for r, q in zip(a, b) for x, y in zip(r, q)), 'not equal'


if __name__ == '__main__':
    run_tool(main)
