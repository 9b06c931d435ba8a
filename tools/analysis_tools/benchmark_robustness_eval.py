"""How much longer a COCO-C evaluation takes than its inference, at real scale, on this machine.

    python tools/analysis_tools/benchmark_robustness_eval.py               # N=300, 2 cells, ~10 min
    python tools/analysis_tools/benchmark_robustness_eval.py --n 5000 --cells 3   # the real figure

A synthetic COCO-format val set (``--n`` images at 640x480, ~7 objects each over 80 classes,
polygon masks; made once and cached in ``--work-dir``) and a stub Mask R-CNN that sleeps a fixed
latency per image (``--rates``: 20 images/s for one GPU, 160 for eight) and returns 100 boxes with
masks at the original size, deterministically. So the CPU goes to what a real run spends it on
besides the model: decoding, corruption, transforms, the metric and the set-up of each cell.

For the clean set and ``--cells`` corruption cells it measures, in one run:
  (i)   inference: the stub's latencies (N / rate per cell);
  (ii)  data: the cells' dataloaders iterated with no model (decode, corrupt, transform, collate);
  (iii) metric: one cell's predictions through each COCO backend (process, then evaluate);
  (iv)  the full loop of tools/test_robustness.py (build_runner + evaluate_robustness) in each
        configuration: ``serial-faster`` (the faster COCO backend, each cell's metric after its
        inference, a dataloader per cell), ``background-faster`` (the metric in a worker process
        beside the next cells' inference, --metric-queue 2), ``one-pass`` (that, and one
        dataloader for every cell: the dataset built once, its workers kept) and ``overlapped``
        (that, and each batch received and preprocessed ahead and post-processed behind the
        model on threads: the default); and ``serial-pycocotools`` (the loop before any of
        them) when asked for with --configurations; at each rate. Every configuration reads
        the pipeline the loop reads (ground-truth masks not decoded: the metric reads its
        annotation file), and (ii) measures that pipeline.
The figure is full / max(i, ii), per configuration, per cell and in total, with the per-cell
range (a few cells stand for all 76), and the main thread's own milliseconds per image beyond
the model's latency, from the loop's time account ((inference - data wait) / images - 1 / rate:
receiving, preprocessing, post-processing, hooks). The goal is at most 1.15x: metric and
set-up hidden behind the bottleneck; when it is not reached the output says which share is not
hidden.
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
import time
from typing import Dict, List, Optional, Tuple

import cv2
import numpy as np
import torch
from mmdet.models.detectors.base import BaseDetector
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmengine.config import Config
from mmengine.structures import InstanceData

from mmrobust.corruptions import Protocol
from mmrobust.datasets.synthetic_coco import synthetic_coco_gt
from mmrobust.evaluation.coco_metric import coco_backend
from mmrobust.evaluation.metrics import CLEAN
from mmrobust.utils.io import atomic_json

GOAL = 1.15
_IN_LOOP = dict(post_process_queue=0, prefetch=0)  # NOTE: the host work on the main thread
CONFIGURATIONS = {  # name -> evaluate_robustness options
    'serial-pycocotools': dict(coco_backend='pycocotools', metric_queue=0, one_pass=False,
                               **_IN_LOOP),
    'serial-faster': dict(coco_backend='faster-coco-eval', metric_queue=0, one_pass=False,
                          **_IN_LOOP),
    'background-faster': dict(coco_backend='faster-coco-eval', metric_queue=2, one_pass=False,
                              **_IN_LOOP),
    'one-pass': dict(coco_backend='faster-coco-eval', metric_queue=2, one_pass=True, **_IN_LOOP),
    'overlapped': dict(coco_backend='faster-coco-eval', metric_queue=2, one_pass=True,
                       post_process_queue=2, prefetch=2),
}
DEFAULT_CELLS = [('gaussian_noise', 3), ('fog', 3), ('motion_blur', 3), ('jpeg_compression', 3),
                 ('snow', 3)]
_SET_VERSION = 2  # bump when the synthetic set changes


# -- the stub detector -----------------------------------------------------------------------------

@MODELS.register_module()
class RobustnessBenchStub(BaseDetector):
    """A stand-in for a Mask R-CNN on a GPU: a fixed time per image.

    Sleeps ``1 / images_per_s`` per image and returns ``detections`` boxes with masks at the
    original size (a benchmark stand-in for a Mask R-CNN on a GPU).

    Boxes and masks are fixed per image size (made once); scores and labels are drawn from the
    image id, so every run predicts the same.
    """

    def __init__(self, images_per_s: float, detections: int = 100, num_classes: int = 80,
                 data_preprocessor: Optional[dict] = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.latency = 1.0 / images_per_s if images_per_s > 0 else 0.0
        self.detections, self.num_classes = detections, num_classes
        self._templates: Dict[Tuple[int, int], Tuple[torch.Tensor, torch.Tensor]] = {}

    def _template(self, h: int, w: int) -> Tuple[torch.Tensor, torch.Tensor]:
        if (h, w) not in self._templates:
            rng = np.random.default_rng(h * 10007 + w)
            sizes = np.exp(rng.uniform(np.log(8), np.log(min(h, w) * 0.8), (self.detections, 2)))
            x1 = rng.uniform(0, w - sizes[:, 0])
            y1 = rng.uniform(0, h - sizes[:, 1])
            boxes = np.stack([x1, y1, x1 + sizes[:, 0], y1 + sizes[:, 1]], 1)
            masks = np.zeros((self.detections, h, w), np.uint8)
            for mask, (a, b, c, d) in zip(masks, boxes):
                centre = (int((a + c) / 2), int((b + d) / 2))
                cv2.ellipse(mask, centre, (max(1, int((c - a) / 2)), max(1, int((d - b) / 2))),
                            0, 0, 360, 1, -1)
            self._templates[h, w] = (torch.from_numpy(boxes).float(),
                                     torch.from_numpy(masks.astype(bool)))
        return self._templates[h, w]

    def predict(self, batch_inputs: torch.Tensor, batch_data_samples: List[DetDataSample],
                rescale: bool = True) -> List[DetDataSample]:
        """Sleep the latency, then the fixed detections."""
        if self.latency:
            time.sleep(self.latency * len(batch_data_samples))
        for sample in batch_data_samples:
            h, w = sample.ori_shape
            boxes, masks = self._template(h, w)
            rng = np.random.default_rng(int(sample.img_id))
            pred = InstanceData()
            pred.bboxes = boxes
            pred.scores = torch.from_numpy(np.sort(rng.random(self.detections))[::-1].copy())
            pred.labels = torch.from_numpy(rng.integers(0, self.num_classes, self.detections))
            pred.masks = masks
            sample.pred_instances = pred
        return batch_data_samples

    def loss(self, batch_inputs, batch_data_samples):
        """Not implemented: the stub does not train."""
        raise NotImplementedError('a benchmark stub: it does not train')

    def _forward(self, batch_inputs, batch_data_samples=None):
        raise NotImplementedError('a benchmark stub: it only predicts')

    def extract_feat(self, batch_inputs):
        """Not implemented: the stub has no features."""
        raise NotImplementedError('a benchmark stub: it has no features')


# -- the synthetic set and its config --------------------------------------------------------------

def make_set(root: str, n: int, seed: int = 0) -> str:
    """A COCO-format val set of ``n`` 640x480 JPEGs under ``root`` (kept; remade when different)."""
    marker = osp.join(root, 'done.json')
    spec = {'n': n, 'seed': seed, 'version': _SET_VERSION}
    if osp.isfile(marker) and json.load(open(marker)) == spec:
        return root
    gt = synthetic_coco_gt(n, 80, size=(480, 640), seed=seed)
    from mmdet.datasets import CocoDataset
    for cat, name in zip(gt['categories'], CocoDataset.METAINFO['classes']):
        cat['name'] = name  # NOTE: mmdet's COCO config maps classes to ids by these names
    os.makedirs(osp.join(root, 'val2017'), exist_ok=True)
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    rng = np.random.default_rng(seed)
    by_image: Dict[int, list] = {}
    for ann in gt['annotations']:
        by_image.setdefault(ann['image_id'], []).append(ann)
    for img in gt['images']:
        # a textured background (JPEG-decoding cost of a photo, not of a flat image)
        small = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
        image = cv2.resize(small, (640, 480), interpolation=cv2.INTER_CUBIC)
        image = np.clip(image + rng.normal(0, 12, image.shape), 0, 255).astype(np.uint8)
        for ann in by_image.get(img['id'], []):
            poly = np.asarray(ann['segmentation'][0]).reshape(-1, 2).round().astype(np.int32)
            cv2.fillPoly(image, [poly], tuple(int(c) for c in rng.integers(0, 256, 3)))
        cv2.imwrite(osp.join(root, 'val2017', img['file_name']), image,
                    [cv2.IMWRITE_JPEG_QUALITY, 90])
    atomic_json(osp.join(root, 'annotations', 'instances_val2017.json'), gt)
    atomic_json(marker, spec)
    return root


def bench_config(root: str, work_dir: str, rate: float, workers: int) -> Config:
    """mmdet's COCO instance-segmentation test set-up on the synthetic set, with the stub."""
    path = osp.join(work_dir, 'bench_cfg.py')
    with open(path, 'w') as f:
        f.write("_base_ = ['mmdet::_base_/datasets/coco_instance.py', "
                "'mmdet::_base_/default_runtime.py']\n")
    cfg = Config.fromfile(path)
    cfg.work_dir = work_dir
    cfg.model = dict(type='RobustnessBenchStub', images_per_s=rate, data_preprocessor=dict(
        type='DetDataPreprocessor', mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True, pad_size_divisor=32))
    loader = cfg.test_dataloader
    loader.num_workers, loader.persistent_workers = workers, workers > 0
    loader.dataset.data_root = root + '/'
    ann = osp.join(root, 'annotations', 'instances_val2017.json')
    cfg.test_evaluator = dict(type='CocoMetric', ann_file=ann, metric=['bbox', 'segm'],
                              format_only=False)
    cfg.test_cfg = dict(type='TestLoop')
    cfg.default_hooks.logger.interval = 10 ** 6
    cfg.train_dataloader = cfg.val_dataloader = cfg.val_evaluator = cfg.val_cfg = None
    return cfg


# -- the four measurements -------------------------------------------------------------------------

def _protocol(cells: List[Tuple[str, int]]) -> Protocol:
    table: Dict[str, tuple] = {}
    for name, severity in cells:
        table[name] = table.get(name, ()) + (severity, )
    return Protocol('bench', 'benchmark cells', table)


def measure_data(cfg: Config, cells: List[Tuple[str, int]]) -> Dict[str, float]:
    """(ii) seconds to iterate each cell's dataloader (and the data preprocessor) with no model."""
    from mmengine.runner import Runner

    from mmrobust.evaluation import cell_dataloader
    from mmrobust.evaluation.evaluator_cfg import without_unread_gt_masks
    cfg, _ = without_unread_gt_masks(cfg, cfg.test_evaluator)  # NOTE: what the loop reads
    preprocessor = MODELS.build(cfg.model).data_preprocessor
    out = {}
    for corruption, severity in [(CLEAN, 0)] + cells:
        start = time.perf_counter()
        loader = Runner.build_dataloader(cell_dataloader(
            cfg, corruption, severity, 0, False, None))
        for batch in loader:
            preprocessor(batch, False)
        out[f'{corruption}/{severity}'] = time.perf_counter() - start
        del loader
    return out


def measure_metric(cfg: Config, n: int) -> Dict[str, Dict[str, float]]:
    """(iii) one cell's predictions through each backend: process (in the loop) and evaluate."""
    from mmdet.registry import METRICS

    from mmrobust.evaluation.evaluator_cfg import select_coco_backend
    model = MODELS.build(cfg.model)
    model.latency = 0.0
    gt = json.load(open(cfg.test_evaluator['ann_file']))
    samples = []
    for img in gt['images']:
        sample = DetDataSample(metainfo=dict(img_id=img['id'], ori_shape=(img['height'],
                                                                          img['width'])))
        samples.append(model.predict(None, [sample])[0])
    classes = [c['name'] for c in gt['categories']]
    out = {}
    for backend in ('pycocotools', 'faster-coco-eval'):
        evaluator, _ = select_coco_backend(dict(cfg.test_evaluator), backend)
        metric = METRICS.build(evaluator)
        metric.dataset_meta = dict(classes=classes)
        start = time.perf_counter()
        for sample in samples:
            metric.process({}, [sample.to_dict()])
        middle = time.perf_counter()
        metric.evaluate(n)
        out[backend] = {'process_s': middle - start, 'evaluate_s': time.perf_counter() - middle}
    return out


def measure_loop(cfg: Config, cells: List[Tuple[str, int]], results: str,
                 options: Dict, images: int) -> Dict[str, float]:
    """(iv) tools/test_robustness.py's code path.

    Seconds per cell (its results' wall_s: the cell's inference and the loop's wait for its metric),
    its metric seconds and waits.
    """
    from mmrobust.apis import apply_common_args, build_runner
    from mmrobust.evaluation import RobustnessOptions, evaluate_robustness
    if osp.exists(results):
        os.remove(results)
    start = time.perf_counter()
    cfg = apply_common_args(cfg, cfg.filename, 'none', cfg.work_dir, None)
    runner = build_runner(cfg, ('test_dataloader', ))
    runner.call_hook('before_run')
    data = evaluate_robustness(runner, cfg, _protocol(cells), results,
                               RobustnessOptions(progress=False, **options))
    total = time.perf_counter() - start
    timing = {f'{c}/{s}': data['timing'][c][str(s)] for c, s in [(CLEAN, 0)] + cells}
    latency = runner.model.latency
    # NOTE: the loop's account: what the main thread did per image besides the model's latency
    # and waiting for data (receiving, preprocessing, post-processing, hooks)
    own_ms = {k: 1000 * ((t['inference_s'] - t.get('data_wait_s', 0.0)) / images - latency)
              for k, t in timing.items()}
    return {'total_s': total, 'cells': {k: t['wall_s'] for k, t in timing.items()},
            'main_thread_ms': own_ms, 'gt_masks': data.get('gt_masks'),
            'metric_s': {k: t['metric_s'] for k, t in timing.items()},
            'wait_s': {k: t['wait_s'] for k, t in timing.items()}, 'time': data['time']}


# -- the report ------------------------------------------------------------------------------------

def _range(values: List[float]) -> str:
    return f'{np.median(values):.2f}x ({min(values):.2f}-{max(values):.2f}x)'


def main() -> None:
    """Time the robustness loop configurations; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--n', type=int, default=300, help='images (default 300)')
    parser.add_argument('--cells', type=int, default=2, help='corruption cells besides clean')
    parser.add_argument('--rates', type=float, nargs='+', default=[20.0, 160.0],
                        help='stub images/s (20: one GPU, 160: eight)')
    parser.add_argument('--configurations', nargs='+',
                        default=['serial-faster', 'one-pass', 'overlapped'],
                        choices=list(CONFIGURATIONS))
    parser.add_argument('--workers', type=int, default=2, help='dataloader workers')
    parser.add_argument('--work-dir', default='work_dirs/benchmark_robustness_eval')
    parser.add_argument('--out', default=None, help='also write the figures to this JSON')
    args = parser.parse_args()
    if not 1 <= args.cells <= len(DEFAULT_CELLS):
        parser.error(f'--cells must be in 1..{len(DEFAULT_CELLS)}')
    coco_backend('faster-coco-eval')  # a missing library stops here, not after minutes
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    cells = DEFAULT_CELLS[:args.cells]
    work = osp.abspath(args.work_dir)
    os.makedirs(work, exist_ok=True)
    wall = time.perf_counter()
    root = make_set(osp.join(work, f'coco_{args.n}'), args.n)
    print(f'{args.n} images, clean + {", ".join(f"{c}/{s}" for c, s in cells)}; '
          f'{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; set ready after '
          f'{time.perf_counter() - wall:.0f} s', flush=True)

    base = bench_config(root, work, args.rates[0], args.workers)
    data = measure_data(base, cells)
    print(f'(ii) data: {sum(data.values()):.1f} s for {len(data)} cells', flush=True)
    metric = measure_metric(base, args.n)
    for backend, t in metric.items():
        print(f'(iii) metric, {backend}: process {t["process_s"]:.1f} s + evaluate '
              f'{t["evaluate_s"]:.1f} s per cell', flush=True)

    report: Dict = {'n': args.n, 'cells': [f'{c}/{s}' for c, s in cells], 'data_s': data,
                    'metric_s': metric, 'loops': {}}
    rows = []
    for rate in args.rates:
        inference = args.n / rate  # (i) per cell
        for name in args.configurations:
            cfg = bench_config(root, work, rate, args.workers)
            loop = measure_loop(cfg, cells, osp.join(work, f'results_{name}_{rate:g}.json'),
                                CONFIGURATIONS[name], args.n)
            bound = {k: max(inference, data[k]) for k in loop['cells']}
            per_cell = [loop['cells'][k] / bound[k] for k in loop['cells']]
            total = loop['total_s'] / sum(bound.values())
            setup = loop['total_s'] - sum(loop['cells'].values())
            report['loops'][f'{name}@{rate:g}'] = {**loop, 'ratio_total': total,
                                                   'ratio_cells': per_cell}
            rows.append((name, rate, inference, loop, total, per_cell, setup))
            spent = loop['time']
            print(f'(iv) {name} at {rate:g} images/s: {loop["total_s"]:.1f} s, '
                  f'{total:.2f}x max(i, ii); the loop\'s own account: ' + ', '.join(
                      f'{k[:-2]} {spent[k]:.1f} s' for k in spent['shares']), flush=True)

    print('\n| configuration | images/s | (i) inference s/cell | (ii) data s/cell | full s | '
          'full / max(i, ii) | per cell | main thread ms/image beyond the model | '
          'metric s/cell | waited s/cell | set-up s |')
    print('|---|---|---|---|---|---|---|---|---|---|---|')
    for name, rate, inference, loop, total, per_cell, setup in rows:
        own = list(loop['main_thread_ms'].values())
        print(f'| {name} | {rate:g} | {inference:.1f} | {np.median(list(data.values())):.1f} | '
              f'{loop["total_s"]:.1f} | {total:.2f}x | {_range(per_cell)} | '
              f'{np.median(own):.1f} ({min(own):.1f}-{max(own):.1f}) | '
              f'{np.median(list(loop["metric_s"].values())):.1f} | '
              f'{np.median(list(loop["wait_s"].values())):.1f} | {setup:.1f} |')
    for name, rate, inference, loop, total, per_cell, setup in rows:
        if total > GOAL:
            cell_bound = {k: max(inference, data[k]) for k in loop['cells']}
            hidden_not = sum(loop['cells'].values()) - sum(cell_bound.values())
            backend = CONFIGURATIONS[name]['coco_backend']
            m = metric[backend]
            print(f'- {name} at {rate:g} images/s: {total:.2f}x > {GOAL}x. Not hidden: '
                  f'{hidden_not:.1f} s over the bound in the cells, of which the metric '
                  f'(process {m["process_s"]:.1f} s + evaluate {m["evaluate_s"]:.1f} s per '
                  f'cell, after each cell\'s inference) is up to '
                  f'{(m["process_s"] + m["evaluate_s"]) * len(loop["cells"]):.1f} s; set-up '
                  f'before the first cell {setup:.1f} s.')
    print(f'\nwall time {time.perf_counter() - wall:.0f} s; load average now '
          f'{os.getloadavg()[0]:.2f}')
    if args.out:
        atomic_json(args.out, report)


if __name__ == '__main__':
    run_tool(main)
