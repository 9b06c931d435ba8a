"""Synthetic COCO-format ground truth and detections at any scale, for metric tests and benchmarks.

No pixels: objects are polygons (for masks) with their boxes, crowd regions are uncompressed RLE
(as COCO stores them), and detections are jittered copies of the objects plus false positives,
with masks encoded from polygons (no full-size arrays). Deterministic for a seed.
"""
import argparse
from typing import Any, Dict, List, Tuple

import numpy as np
import pycocotools.mask as mask_utils

__all__ = ['synthetic_coco_gt', 'synthetic_detections', 'detections_to_coco_results',
           'synthetic_coco_cell', 'synthetic_coco_parser']


def _polygon(rng: np.random.Generator, x: float, y: float, w: float, h: float) -> List[float]:
    """A star-ish polygon inside the box (x, y, w, h): 8-16 vertices around its centre."""
    n = int(rng.integers(8, 17))
    angles = np.sort(rng.uniform(0, 2 * np.pi, n))
    radius = rng.uniform(0.6, 1.0, n)
    xs = x + w / 2 + np.cos(angles) * radius * w / 2
    ys = y + h / 2 + np.sin(angles) * radius * h / 2
    return np.stack([xs, ys], 1).round(2).ravel().tolist()


def _uncompressed_rle(mask: np.ndarray) -> Dict:
    """COCO's uncompressed RLE of a binary mask (column-major run lengths, zeros first)."""
    flat = mask.T.ravel().astype(np.uint8)
    change = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat[0]:
        counts = [0] + counts
    return {'size': list(mask.shape), 'counts': counts}


def synthetic_coco_gt(num_images: int, num_classes: int = 80, objects_per_image: float = 7.0,
                      size: Tuple[int, int] = (480, 640), crowd_prob: float = 0.0,
                      empty_prob: float = 0.0, seed: int = 0) -> Dict:
    """A COCO instances dict: images of ``size`` (h, w) with ~``objects_per_image`` polygon objects.

    Args:
        num_images: images in the set.
        num_classes: categories (ids 1 to ``num_classes``).
        objects_per_image: mean objects per image (Poisson, at least one).
        size: ``(h, w)`` of every image.
        crowd_prob: chance that an image also has one crowd region (``iscrowd=1``, RLE).
        empty_prob: chance that an image has no annotation at all.
        seed: seed of the generator.

    Returns:
        ``{'images', 'annotations', 'categories'}``; areas are the polygons' own (as COCO's),
        object sizes span COCO's small / medium / large ranges.
    """
    rng = np.random.default_rng(seed)
    h, w = size
    images, anns = [], []
    for img_id in range(1, num_images + 1):
        images.append({'id': img_id, 'file_name': f'{img_id:012d}.jpg', 'height': h, 'width': w})
        if rng.random() < empty_prob:
            continue
        for _ in range(max(1, int(rng.poisson(objects_per_image)))):
            side = float(np.exp(rng.uniform(np.log(8), np.log(min(h, w) * 0.9))))
            bw, bh = side * rng.uniform(0.6, 1.4), side * rng.uniform(0.6, 1.4)
            bw, bh = min(bw, w - 2), min(bh, h - 2)
            x, y = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            poly = _polygon(rng, x, y, bw, bh)
            rle = mask_utils.frPyObjects([poly], h, w)
            anns.append({'id': len(anns) + 1, 'image_id': img_id, 'iscrowd': 0,
                         'category_id': int(rng.integers(1, num_classes + 1)),
                         'segmentation': [poly],
                         'area': float(mask_utils.area(rle).sum()),
                         'bbox': [round(v, 2) for v in mask_utils.toBbox(rle)[0].tolist()]})
        if rng.random() < crowd_prob:
            cw, ch = int(rng.integers(w // 6, w // 2)), int(rng.integers(h // 6, h // 2))
            cx, cy = int(rng.integers(0, w - cw)), int(rng.integers(0, h - ch))
            crowd = np.zeros(size, np.uint8)
            crowd[cy:cy + ch, cx:cx + cw] = rng.random((ch, cw)) < 0.8
            anns.append({'id': len(anns) + 1, 'image_id': img_id, 'iscrowd': 1,
                         'category_id': int(rng.integers(1, num_classes + 1)),
                         'segmentation': _uncompressed_rle(crowd),
                         'area': float(crowd.sum()), 'bbox': [cx, cy, cw, ch]})
    categories = [{'id': i, 'name': f'class_{i}', 'supercategory': 'thing'}
                  for i in range(1, num_classes + 1)]
    return {'images': images, 'annotations': anns, 'categories': categories}


def synthetic_detections(gt: Dict, per_image: int = 100, recall: float = 0.85,
                         no_detection_prob: float = 0.0, seed: int = 0) -> List[Dict]:
    """Synthetic detections for ``gt``, per image.

    Detections for ``gt``: per image ``bboxes`` (xyxy), ``scores``, ``labels`` (category index in
    ``gt['categories']``) and ``masks`` (compressed RLE), ``per_image`` of them.

    A share ``recall`` of the non-crowd objects is found (jittered box and polygon, a high score,
    sometimes the wrong class); the rest are false positives with lower scores. An image has no
    detection with probability ``no_detection_prob``.
    """
    rng = np.random.default_rng(seed + 1)
    by_image: Dict[int, list] = {}
    for ann in gt['annotations']:
        by_image.setdefault(ann['image_id'], []).append(ann)
    cat_index = {c['id']: i for i, c in enumerate(gt['categories'])}
    num_classes = len(gt['categories'])
    out = []
    for img in gt['images']:
        h, w = img['height'], img['width']
        boxes, scores, labels, polys = [], [], [], []
        if rng.random() >= no_detection_prob:
            for ann in by_image.get(img['id'], []):
                if ann['iscrowd'] or rng.random() > recall or len(boxes) >= per_image:
                    continue
                x, y, bw, bh = ann['bbox']
                dx, dy = rng.normal(0, 0.08, 2) * (bw, bh)
                sx, sy = np.exp(rng.normal(0, 0.1, 2))
                nx, ny = np.clip(x + dx, 0, w - 1), np.clip(y + dy, 0, h - 1)
                nw, nh = min(bw * sx, w - nx), min(bh * sy, h - ny)
                boxes.append([nx, ny, nx + nw, ny + nh])
                scores.append(rng.uniform(0.5, 1.0))
                wrong = rng.random() < 0.1
                labels.append(int(rng.integers(num_classes)) if wrong
                              else cat_index[ann['category_id']])
                # the object's own outline, moved and scaled as its box
                outline = np.asarray(ann['segmentation'][0]).reshape(-1, 2)
                outline = (outline - (x, y)) * (sx, sy) + (nx, ny)
                polys.append(outline.round(2).ravel().tolist())
            while len(boxes) < per_image:
                side = float(np.exp(rng.uniform(np.log(6), np.log(min(h, w) * 0.8))))
                nw, nh = side * rng.uniform(0.5, 1.5), side * rng.uniform(0.5, 1.5)
                nw, nh = min(nw, w - 2), min(nh, h - 2)
                nx, ny = rng.uniform(0, w - nw), rng.uniform(0, h - nh)
                boxes.append([nx, ny, nx + nw, ny + nh])
                scores.append(rng.uniform(0.0, 0.7))
                labels.append(int(rng.integers(num_classes)))
                polys.append(_polygon(rng, nx, ny, nw, nh))
        masks = [mask_utils.merge(mask_utils.frPyObjects([p], h, w)) for p in polys]
        out.append({'img_id': img['id'], 'ori_shape': (h, w),
                    'bboxes': np.asarray(boxes, np.float32).reshape(-1, 4),
                    'scores': np.asarray(scores, np.float32),
                    'labels': np.asarray(labels, np.int64), 'masks': masks})
    return out


def detections_to_coco_results(detections: List[Dict], gt: Dict, iou_type: str) -> List[Dict]:
    """``detections`` in COCO's results format (``loadRes``) for ``'bbox'`` or ``'segm'``."""
    cat_ids = [c['id'] for c in gt['categories']]
    results = []
    for det in detections:
        for box, score, label, mask in zip(det['bboxes'], det['scores'], det['labels'],
                                           det['masks']):
            entry = {'image_id': det['img_id'], 'category_id': cat_ids[label],
                     'score': float(score)}
            if iou_type == 'bbox':
                x1, y1, x2, y2 = box.tolist()
                entry['bbox'] = [x1, y1, x2 - x1, y2 - y1]
            else:
                counts = mask['counts']
                entry['segmentation'] = {'size': mask['size'], 'counts': counts.decode()
                                         if isinstance(counts, bytes) else counts}
            results.append(entry)
    return results


# -- the synthetic COCO cell of the metric benchmarks ---------------------------------------------

def synthetic_coco_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser with the arguments of a synthetic COCO cell.

    A benchmark's parser (described by the first line of ``doc``) with the arguments of a synthetic
    COCO-format cell (``benchmark_coco_metric.py``, ``benchmark_bootstrap.py``): images, detections
    per image, classes, timed rounds, seed.
    """
    parser = argparse.ArgumentParser(description=doc.split('\n')[0])
    parser.add_argument('--n', type=int, default=500, help='images (default 500)')
    parser.add_argument('--per-image', type=int, default=100, help='detections per image')
    parser.add_argument('--classes', type=int, default=80)
    parser.add_argument('--rounds', type=int, default=3, help='timed rounds (default 3)')
    parser.add_argument('--seed', type=int, default=0)
    return parser


def synthetic_coco_cell(args: Any) -> Tuple[Dict, List[Dict]]:
    """The ground truth and the detections of a synthetic COCO cell.

    The ground truth (crowd regions in 5% of the images) and the detections of the cell
    :func:`synthetic_coco_parser` describes.
    """
    gt = synthetic_coco_gt(args.n, args.classes, crowd_prob=0.05, seed=args.seed)
    return gt, synthetic_detections(gt, per_image=args.per_image, seed=args.seed)
