"""Deterministic toy datasets in the real COCO and Cityscapes layouts.

No dataset can be downloaded where mmrobust is developed and tested, so the project writes its
own: a small COCO-format instance-segmentation set (shapes on textured backgrounds) and a small
Cityscapes-format semantic-segmentation set (synthetic street scenes with ``*_labelTrainIds.png``).
Both are written from a seed alone, in seconds, and are learnable by a real detector/segmentor.

Every image draws from its own ``numpy.random.Generator`` seeded with (seed, split, index), so the
files do not depend on generation order, and all writes go through a temp file + rename.
"""
import json
import math
import os.path as osp
from typing import Callable, Dict, List, Sequence, Tuple

import cv2
import numpy as np

from ..utils.errors import UnknownNameError
from ..utils.io import atomic_bytes

TOY_COCO_CLASSES = ('circle', 'square', 'triangle', 'star', 'hexagon')
# NOTE: each class has its own hue band (plus its shape), so a small detector trained for a few
# hundred CPU iterations reaches a clearly non-zero AP; hues overlap enough to need the shape too.
_CLASS_HUES = (0, 35, 70, 110, 150)  # OpenCV hue units (0..179)

CITYSCAPES_CLASSES = ('road', 'sidewalk', 'building', 'wall', 'fence', 'pole', 'traffic light',
                      'traffic sign', 'vegetation', 'terrain', 'sky', 'person', 'rider', 'car',
                      'truck', 'bus', 'train', 'motorcycle', 'bicycle')
CITYSCAPES_PALETTE = ((128, 64, 128), (244, 35, 232), (70, 70, 70), (102, 102, 156),
                      (190, 153, 153), (153, 153, 153), (250, 170, 30), (220, 220, 0),
                      (107, 142, 35), (152, 251, 152), (70, 130, 180), (220, 20, 60),
                      (255, 0, 0), (0, 0, 142), (0, 0, 70), (0, 60, 100), (0, 80, 100),
                      (0, 0, 230), (119, 11, 32))
# Cityscapes label ids of the 19 train ids (for the `*_labelIds.png` files); 255 -> 0 (unlabeled).
_TRAIN_ID_TO_ID = (7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31, 32, 33)
IGNORE_INDEX = 255

_SPLITS = {'train': 0, 'val': 1}


# -- helpers ---------------------------------------------------------------------------------------
def _rng(seed: int, split: str, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, _SPLITS[split], index])


def _write_image(path: str, img_rgb: np.ndarray, jpeg_quality: int = 92) -> None:
    ext = osp.splitext(path)[1]
    params = [cv2.IMWRITE_JPEG_QUALITY, jpeg_quality] if ext in ('.jpg', '.jpeg') else []
    img = img_rgb[..., ::-1] if img_rgb.ndim == 3 else img_rgb
    ok, buf = cv2.imencode(ext, np.ascontiguousarray(img), params)
    if not ok:
        raise RuntimeError(f'OpenCV could not encode {path}')
    atomic_bytes(path, buf.tobytes(), fsync=False)


def _write_json(path: str, obj: dict) -> None:
    atomic_bytes(path, json.dumps(obj).encode(), fsync=False)


def _value_noise(rng: np.random.Generator, h: int, w: int, octaves: int = 4) -> np.ndarray:
    """Multi-octave smooth noise in [0, 1], shape (h, w)."""
    out = np.zeros((h, w), np.float32)
    amp, total = 1.0, 0.0
    for o in range(octaves):
        cells = 2 ** (o + 1)
        grid = rng.random((cells + 1, cells + 1)).astype(np.float32)
        out += amp * cv2.resize(grid, (w, h), interpolation=cv2.INTER_CUBIC)
        total += amp
        amp *= 0.5
    out /= total
    return np.clip((out - out.min()) / (np.ptp(out) + 1e-6), 0, 1)


def _random_colour(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 256, 3).astype(np.float32)


def _textured_background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """One of several background textures with random colours, float32 RGB in [0, 255]."""
    c1, c2 = _random_colour(rng), _random_colour(rng)
    kind = rng.integers(0, 4)
    if kind == 0:  # smooth blotches
        t = _value_noise(rng, h, w)
    elif kind == 1:  # oriented stripes
        theta, freq = rng.uniform(0, math.pi), rng.uniform(0.03, 0.15)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        t = 0.5 + 0.5 * np.sin(freq * (xx * math.cos(theta) + yy * math.sin(theta)))
    elif kind == 2:  # checkerboard
        cell = int(rng.integers(12, 40))
        yy, xx = np.mgrid[0:h, 0:w]
        t = (((yy // cell) + (xx // cell)) % 2).astype(np.float32)
    else:  # gradient
        t = np.linspace(0, 1, w, dtype=np.float32)[None].repeat(h, 0)
        if rng.random() < 0.5:
            t = t.T.copy() if h == w else cv2.resize(t.T.copy(), (w, h))
    img = c1 * (1 - t[..., None]) + c2 * t[..., None]
    img += rng.normal(0, 8, (h, w, 1)).astype(np.float32)  # grain
    return img


def _polygon(rng: np.random.Generator, shape: str, cx: float, cy: float,
             r: float) -> np.ndarray:
    """Vertices (N, 2) of a rotated shape of circumradius ``r``."""
    rot = rng.uniform(0, 2 * math.pi)
    if shape == 'circle':
        n, radii = 40, [r] * 40
        aspect = rng.uniform(0.75, 1.0)  # slight ellipses
    elif shape == 'square':
        n, radii, aspect = 4, [r] * 4, 1.0
    elif shape == 'triangle':
        n, radii, aspect = 3, [r] * 3, 1.0
    elif shape == 'star':
        n, aspect = 10, 1.0
        radii = [r if i % 2 == 0 else r * 0.45 for i in range(n)]
    elif shape == 'hexagon':
        n, radii, aspect = 6, [r] * 6, 1.0
    else:
        raise ValueError(f'unknown shape {shape!r}')
    ang = rot + np.arange(n) * 2 * math.pi / n
    pts = np.stack([np.cos(ang) * radii, np.sin(ang) * radii * aspect], 1)
    if shape == 'circle':
        c, s = math.cos(rot), math.sin(rot)
        pts = pts @ np.array([[c, -s], [s, c]])
    return pts + np.array([cx, cy])


def _hsv_to_rgb(h: float, s: float, v: float) -> np.ndarray:
    px = np.uint8([[[round(h) % 180, round(s), round(v)]]])
    return cv2.cvtColor(px, cv2.COLOR_HSV2RGB)[0, 0].astype(np.float32)


# -- toy COCO --------------------------------------------------------------------------------------
def _toy_coco_image(rng: np.random.Generator) -> Tuple[np.ndarray, List[dict]]:
    w, h = (int(v) for v in rng.integers(256, 321, 2))
    img = _textured_background(rng, h, w)
    objects: List[dict] = []
    boxes: List[Tuple[float, float, float, float]] = []
    for _ in range(int(rng.integers(1, 6))):
        for _attempt in range(20):
            label = int(rng.integers(len(TOY_COCO_CLASSES)))
            r = rng.uniform(18, 58)
            cx, cy = rng.uniform(r * 0.6, w - r * 0.6), rng.uniform(r * 0.6, h - r * 0.6)
            pts = _polygon(rng, TOY_COCO_CLASSES[label], cx, cy, r)
            pts[:, 0] = np.clip(pts[:, 0], 0, w - 1)
            pts[:, 1] = np.clip(pts[:, 1], 0, h - 1)
            x0, y0 = pts.min(0)
            x1, y1 = pts.max(0)
            # NOTE: objects never overlap (4 px margin), so polygons are exact instance masks.
            if all(x0 - 4 > b[2] or x1 + 4 < b[0] or y0 - 4 > b[3] or y1 + 4 < b[1]
                   for b in boxes) and (x1 - x0) > 8 and (y1 - y0) > 8:
                break
        else:
            continue
        boxes.append((x0, y0, x1, y1))
        mask = np.zeros((h, w), np.uint8)
        cv2.fillPoly(mask, [np.round(pts * 16).astype(np.int32)], 1, cv2.LINE_8, shift=4)
        if mask.sum() < 16:
            boxes.pop()
            continue
        colour = _hsv_to_rgb(_CLASS_HUES[label] + rng.normal(0, 8), rng.uniform(120, 255),
                             rng.uniform(110, 255))
        # keep the object visible against whatever lies under it
        under = img[mask.astype(bool)].mean(0)
        if np.abs(under - colour).mean() < 40:
            colour = np.where(under > 127, colour * 0.45, np.minimum(colour + 110, 255))
        shade = 1 + 0.25 * (_value_noise(rng, h, w, octaves=2) - 0.5)
        obj = colour[None, None] * shade[..., None] + rng.normal(0, 6, (h, w, 1))
        m = mask.astype(bool)
        img[m] = obj[m]
        area = int(m.sum())
        objects.append(dict(
            category_id=label + 1, segmentation=[pts.round(2).flatten().tolist()], area=area,
            bbox=[round(float(x0), 2), round(float(y0), 2), round(float(x1 - x0), 2),
                  round(float(y1 - y0), 2)], iscrowd=0))
    return np.clip(img, 0, 255).astype(np.uint8), objects


def make_toy_coco(root: str, seed: int = 0, num_train: int = 96,
                  num_val: int = 24) -> Dict[str, int]:
    """Write a toy COCO 2017-layout instance segmentation dataset to ``root``.

    Layout: ``train2017/``, ``val2017/`` (JPEG) and ``annotations/instances_{train,val}2017.json``,
    five shape classes, 256-320 px images, polygon masks.

    Returns:
        Number of images and instances per split.
    """
    counts = {}
    categories = [dict(id=i + 1, name=n, supercategory='shape')
                  for i, n in enumerate(TOY_COCO_CLASSES)]
    for split, num in (('train', num_train), ('val', num_val)):
        images, annotations = [], []
        for i in range(num):
            img, objs = _toy_coco_image(_rng(seed, split, i))
            image_id = i + 1
            file_name = f'{image_id:012d}.jpg'
            _write_image(osp.join(root, f'{split}2017', file_name), img)
            images.append(dict(id=image_id, file_name=file_name, height=img.shape[0],
                               width=img.shape[1]))
            for obj in objs:
                annotations.append(dict(id=len(annotations) + 1, image_id=image_id, **obj))
        _write_json(osp.join(root, 'annotations', f'instances_{split}2017.json'),
                    dict(info=dict(description=f'mmrobust toy COCO (seed {seed})'),
                         images=images, annotations=annotations, categories=categories))
        counts[f'{split}_images'], counts[f'{split}_instances'] = num, len(annotations)
    return counts


# -- toy Cityscapes --------------------------------------------------------------------------------
def _paint(img: np.ndarray, label: np.ndarray, mask: np.ndarray, train_id: int,
           rng: np.random.Generator, texture: np.ndarray) -> None:
    base = np.array(CITYSCAPES_PALETTE[train_id], np.float32) + rng.normal(0, 12, 3)
    region = mask.astype(bool)
    img[region] = (base[None] * (0.75 + 0.5 * texture[region][:, None]))
    label[region] = train_id


def _toy_cityscapes_image(rng: np.random.Generator, h: int = 256,
                          w: int = 512) -> Tuple[np.ndarray, np.ndarray]:
    img = np.zeros((h, w, 3), np.float32)
    label = np.full((h, w), IGNORE_INDEX, np.uint8)
    tex = _value_noise(rng, h, w, octaves=5)

    def poly(pts: Sequence[Tuple[float, float]]) -> np.ndarray:
        m = np.zeros((h, w), np.uint8)
        cv2.fillPoly(m, [np.round(np.array(pts)).astype(np.int32)], 1)
        return m

    def rect(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
        return poly([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])

    horizon = int(h * rng.uniform(0.38, 0.5))
    vp = w * rng.uniform(0.35, 0.65)  # vanishing point
    _paint(img, label, rect(0, 0, w, horizon + 1), 10, rng, tex)  # sky
    _paint(img, label, rect(0, horizon, w, h), 9, rng, tex)  # terrain under everything
    # buildings rise from the horizon
    x = -rng.uniform(0, 40)
    while x < w:
        bw = rng.uniform(40, 120)
        top = horizon - rng.uniform(0.15, 0.9) * horizon
        cls = 2 if rng.random() < 0.85 else 3  # building or wall
        _paint(img, label, rect(x, top, x + bw, horizon + 2), cls, rng, tex)
        x += bw + rng.uniform(-5, 10)
    for _ in range(int(rng.integers(1, 4))):  # trees
        cx, r = rng.uniform(0, w), rng.uniform(15, 45)
        m = np.zeros((h, w), np.uint8)
        cv2.ellipse(m, (int(cx), int(horizon - r * 0.6)), (int(r), int(r * 1.2)), 0, 0, 360, 1, -1)
        _paint(img, label, m, 8, rng, tex)
    # road and sidewalks in perspective
    left, right = rng.uniform(-0.3, 0.15) * w, rng.uniform(0.85, 1.3) * w
    _paint(img, label, poly([(vp - 6, horizon), (vp + 6, horizon), (right, h), (left, h)]), 0,
           rng, tex)
    _paint(img, label, poly([(vp - 6, horizon), (left, h), (left - 0.35 * w, h),
                             (vp - 12, horizon)]), 1, rng, tex)
    _paint(img, label, poly([(vp + 6, horizon), (right, h), (right + 0.35 * w, h),
                             (vp + 12, horizon)]), 1, rng, tex)
    # poles with signs / lights
    for _ in range(int(rng.integers(1, 4))):
        px = rng.uniform(0, w)
        ph = rng.uniform(0.3, 0.6) * h
        base_y = horizon + rng.uniform(0.1, 0.4) * (h - horizon)
        _paint(img, label, rect(px, base_y - ph, px + 3, base_y), 5, rng, tex)
        top_cls = 7 if rng.random() < 0.6 else 6
        _paint(img, label, rect(px - 7, base_y - ph - 12, px + 10, base_y - ph + 2), top_cls,
               rng, tex)
    # cars on the road, nearer ones lower and bigger
    # far cars first, so nearer ones are painted over them
    for t in np.sort(rng.uniform(0.15, 1.0, int(rng.integers(1, 5)))):
        cy = horizon + t * (h - horizon)
        cw, ch = 30 + 110 * t, 16 + 50 * t
        cx = vp + rng.uniform(-0.6, 0.6) * t * w * 0.8
        cls = 13 if rng.random() < 0.8 else int(rng.choice([14, 15]))
        _paint(img, label, rect(cx - cw / 2, cy - ch, cx + cw / 2, cy), cls, rng, tex)
    # people on the sidewalks
    for _ in range(int(rng.integers(0, 4))):
        t = rng.uniform(0.2, 1.0)
        cy = horizon + t * (h - horizon)
        ph = 20 + 70 * t
        cx = (left - 0.15 * w * t) if rng.random() < 0.5 else (right + 0.15 * w * t)
        cx = float(np.clip(cx + rng.uniform(-30, 30), 5, w - 5))
        m = np.zeros((h, w), np.uint8)
        cv2.ellipse(m, (int(cx), int(cy - ph * 0.45)), (max(2, int(ph * 0.13)), int(ph * 0.42)),
                    0, 0, 360, 1, -1)
        cv2.circle(m, (int(cx), int(cy - ph * 0.92)), max(2, int(ph * 0.09)), 1, -1)
        _paint(img, label, m, 11, rng, tex)
    # the ego vehicle's bonnet at the bottom is unlabelled, as in the real data
    hood = int(h * rng.uniform(0.0, 0.08))
    if hood:
        img[h - hood:] = 30 + rng.normal(0, 4, (hood, w, 1))
        label[h - hood:] = IGNORE_INDEX
    img += rng.normal(0, 5, (h, w, 1))
    return np.clip(img, 0, 255).astype(np.uint8), label


def _instance_ids(ids: np.ndarray) -> np.ndarray:
    """Cityscapes' ``instanceIds`` of a label-id map (uint16).

    A pixel of a class with instances (label ids 24-33) is ``id * 1000 + k``, ``k`` its
    connected region; any other pixel is its label id.
    """
    out = ids.astype(np.uint16)
    for label_id in np.unique(ids):
        if label_id < 24:
            continue
        count, regions = cv2.connectedComponents((ids == label_id).astype(np.uint8))
        for k in range(1, count):
            out[regions == k] = int(label_id) * 1000 + k - 1
    return out


#: Cityscapes' classes with instances, as mmdet's ``CityscapesDataset`` names them, and their ids.
CITYSCAPES_THINGS = (('person', 24), ('rider', 25), ('car', 26), ('truck', 27), ('bus', 28),
                     ('train', 31), ('motorcycle', 32), ('bicycle', 33))


def _instance_annotations(instances: np.ndarray, image_id: int, next_id: int) -> List[dict]:
    """COCO annotations (polygons) of an ``instanceIds`` map's instances.

    As cityscapesscripts' COCO conversion gives them, which mmdet's Cityscapes configs read.
    """
    anns = []
    for value in np.unique(instances[instances >= 1000]):
        mask = (instances == value).astype(np.uint8)
        contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        polygons = [c.reshape(-1).astype(float).tolist() for c in contours if len(c) >= 3]
        if not polygons:
            continue
        x, y, w, h = cv2.boundingRect(mask)
        anns.append({'id': next_id + len(anns), 'image_id': image_id,
                     'category_id': int(value) // 1000, 'segmentation': polygons,
                     'area': float(mask.sum()), 'bbox': [x, y, w, h], 'iscrowd': 0})
    return anns


def make_toy_cityscapes(root: str, seed: int = 0, num_train: int = 32,
                        num_val: int = 8) -> Dict[str, int]:
    """Write a toy Cityscapes-layout semantic segmentation dataset (512x256) to ``root``.

    Layout: ``leftImg8bit/{train,val}/<city>/<city>_<seq>_<frame>_leftImg8bit.png`` and
    ``gtFine/{split}/<city>/..._gtFine_labelTrainIds.png`` (+ ``_gtFine_labelIds.png`` and
    ``_gtFine_instanceIds.png``, which cityscapesscripts' evaluation reads), and the instances
    of the classes that have them as COCO annotations in
    ``annotations/instancesonly_filtered_gtFine_{split}.json`` (mmdet's Cityscapes layout).

    Returns:
        Number of images per split.
    """
    cities = {'train': ('aachen', 'bochum'), 'val': ('frankfurt',)}
    lut = np.zeros(256, np.uint8)
    lut[:len(_TRAIN_ID_TO_ID)] = _TRAIN_ID_TO_ID
    counts = {}
    categories = [{'id': i, 'name': name} for name, i in CITYSCAPES_THINGS]
    for split, num in (('train', num_train), ('val', num_val)):
        images, annotations = [], []
        for i in range(num):
            img, label = _toy_cityscapes_image(_rng(seed, split, i))
            city = cities[split][i % len(cities[split])]
            stem = f'{city}_{i:06d}_000019'
            _write_image(osp.join(root, 'leftImg8bit', split, city, f'{stem}_leftImg8bit.png'), img)
            gt_dir = osp.join(root, 'gtFine', split, city)
            _write_image(osp.join(gt_dir, f'{stem}_gtFine_labelTrainIds.png'), label)
            _write_image(osp.join(gt_dir, f'{stem}_gtFine_labelIds.png'), lut[label])
            instances = _instance_ids(lut[label])
            _write_image(osp.join(gt_dir, f'{stem}_gtFine_instanceIds.png'), instances)
            images.append({'id': i, 'file_name': f'{city}/{stem}_leftImg8bit.png',
                           'height': img.shape[0], 'width': img.shape[1]})
            annotations += _instance_annotations(instances, i, len(annotations) + 1)
        _write_json(osp.join(root, 'annotations', f'instancesonly_filtered_gtFine_{split}.json'),
                    {'images': images, 'annotations': annotations, 'categories': categories})
        counts[f'{split}_images'] = num
    return counts


# -- toy real-world shift sets (mmrobust/datasets/shift_sets.py), in their published layouts ------
# Each draws its own scenes (a stream of its own per set and condition) and degrades them the way
# its condition looks (fog lifts the blacks, night darkens, rain streaks, snow speckles), so a
# model trained on the toy Cityscapes / COCO scores lower there, as on the real sets.

def _shift_rng(seed: int, stream: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, 100 + stream, index])


def _condition(img: np.ndarray, condition: str, rng: np.random.Generator) -> np.ndarray:
    """A toy look of an adverse condition or a depiction domain on an RGB uint8 image."""
    x = img.astype(np.float32)
    h, w = x.shape[:2]
    if condition == 'fog':
        x = 0.45 * x + 0.55 * 200
    elif condition in ('night', 'dark'):
        x = 255 * (x / 255) ** 1.6 * 0.3 + rng.normal(0, 4, x.shape)
    elif condition == 'rain':
        x = 0.75 * x
        for _ in range(int(h * w / 800)):
            x0, y0 = rng.uniform(0, w), rng.uniform(0, h)
            cv2.line(x, (int(x0), int(y0)), (int(x0 + 3), int(y0 + 14)), (200, 200, 210), 1)
    elif condition == 'snow':
        x = 0.8 * x + 0.2 * 235
        dots = rng.random((h, w)) < 0.02
        x[dots] = 250
    elif condition == 'sketch':
        gray = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
        x = np.repeat((255 - cv2.Canny(gray, 50, 150))[..., None], 3, 2).astype(np.float32)
    elif condition == 'cartoon':
        x = (x // 64) * 64 + 32
    elif condition == 'painting':
        x = cv2.GaussianBlur(x, (7, 7), 2.0) + rng.normal(0, 6, x.shape)
    elif condition == 'tattoo':
        gray = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY).astype(np.float32)
        x = np.stack([gray * 0.3 + 160, gray * 0.3 + 120, gray * 0.3 + 100], 2)
    elif condition == 'handmake':
        gray = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY).astype(np.float32)[..., None]
        x = 0.5 * x + 0.5 * gray + rng.normal(0, 10, x.shape)
    else:  # 'weather'
        x = 0.6 * x + 0.4 * 190
    return np.clip(x, 0, 255).astype(np.uint8)


def _write_seg_pair(img_path: str, gt_path: str, img: np.ndarray, label: np.ndarray) -> None:
    _write_image(img_path, img)
    _write_image(gt_path, label)


def make_toy_acdc(root: str, seed: int = 0, per_condition: int = 2) -> Dict[str, int]:
    """Write a toy ACDC (val) in its layout.

    ``rgb_anon/<condition>/val/<seq>/*_rgb_anon.png`` and
    ``gt/<condition>/val/<seq>/*_gt_labelTrainIds.png``.
    """
    counts = {}
    for k, condition in enumerate(('fog', 'night', 'rain', 'snow')):
        for i in range(per_condition):
            rng = _shift_rng(seed, k, i)
            img, label = _toy_cityscapes_image(rng)
            stem = f'GOPR04{75 + k}_frame_{i:06d}'
            seq = stem.split('_')[0]
            _write_seg_pair(
                osp.join(root, 'rgb_anon', condition, 'val', seq, f'{stem}_rgb_anon.png'),
                osp.join(root, 'gt', condition, 'val', seq, f'{stem}_gt_labelTrainIds.png'),
                _condition(img, condition, rng), label)
        counts[f'{condition}_images'] = per_condition
    return counts


def make_toy_foggy_cityscapes(root: str, seed: int = 0, num_val: int = 4) -> Dict[str, int]:
    """Write a toy Foggy Cityscapes (val).

    The toy Cityscapes val scenes of the same seed and names, fogged at the three densities, in
    ``leftImg8bit_foggy/val/<city>/<stem>_leftImg8bit_ foggy_beta_<beta>.png``, beside their
    ``gtFine/val/<city>/<stem>_gtFine_labelTrainIds.png``.
    """
    for i in range(num_val):
        img, label = _toy_cityscapes_image(_rng(seed, 'val', i))
        stem = f'frankfurt_{i:06d}_000019'
        gt_dir = osp.join(root, 'gtFine', 'val', 'frankfurt')
        _write_image(osp.join(gt_dir, f'{stem}_gtFine_labelTrainIds.png'), label)
        for beta in ('0.005', '0.01', '0.02'):
            # NOTE: transmission exp(-beta * d) at a toy depth of 60 m, towards a grey sky
            t = math.exp(-float(beta) * 60)
            fogged = np.clip(img.astype(np.float32) * t + 200 * (1 - t), 0, 255).astype(np.uint8)
            _write_image(osp.join(root, 'leftImg8bit_foggy', 'val', 'frankfurt',
                                  f'{stem}_leftImg8bit_foggy_beta_{beta}.png'), fogged)
    return {'val_images': num_val, 'betas': 3}


def make_toy_dark_zurich(root: str, seed: int = 0, num_val: int = 3) -> Dict[str, int]:
    """Write a toy Dark Zurich (val) in its layout.

    ``rgb_anon/val/night/<seq>/*_rgb_anon.png`` and ``gt/val/night/<seq>/*_gt_labelTrainIds.png``.
    """
    for i in range(num_val):
        rng = _shift_rng(seed, 10, i)
        img, label = _toy_cityscapes_image(rng)
        stem = f'GOPR0356_{i:06d}'
        _write_seg_pair(osp.join(root, 'rgb_anon', 'val', 'night', 'GOPR0356',
                                 f'{stem}_rgb_anon.png'),
                        osp.join(root, 'gt', 'val', 'night', 'GOPR0356',
                                 f'{stem}_gt_labelTrainIds.png'),
                        _condition(img, 'night', rng), label)
    return {'val_images': num_val}


def make_toy_coco_o(root: str, seed: int = 0, per_domain: int = 4) -> Dict[str, int]:
    """Write a toy COCO-O in its layout.

    ``<domain>/val2017/*.jpg`` and ``<domain>/annotations/instances_val2017.json`` for its six
    domains, the toy COCO classes.
    """
    categories = [dict(id=i + 1, name=n, supercategory='shape')
                  for i, n in enumerate(TOY_COCO_CLASSES)]
    counts = {}
    domains = ('sketch', 'weather', 'cartoon', 'painting', 'tattoo', 'handmake')
    for k, domain in enumerate(domains):
        images, annotations = [], []
        for i in range(per_domain):
            rng = _shift_rng(seed, 20 + k, i)
            img, objs = _toy_coco_image(rng)
            image_id = i + 1
            file_name = f'{image_id:012d}.jpg'
            _write_image(osp.join(root, domain, 'val2017', file_name),
                         _condition(img, domain, rng))
            images.append(dict(id=image_id, file_name=file_name, height=img.shape[0],
                               width=img.shape[1]))
            for obj in objs:
                annotations.append(dict(id=len(annotations) + 1, image_id=image_id, **obj))
        _write_json(osp.join(root, domain, 'annotations', 'instances_val2017.json'),
                    dict(info=dict(description=f'mmrobust toy COCO-O {domain} (seed {seed})'),
                         images=images, annotations=annotations, categories=categories))
        counts[f'{domain}_images'] = per_domain
    return counts


TOY_DATASETS: Dict[str, Callable[..., Dict[str, int]]] = {
    'toy_coco': make_toy_coco,
    'toy_cityscapes': make_toy_cityscapes,
    'toy_acdc': make_toy_acdc,
    'toy_foggy_cityscapes': make_toy_foggy_cityscapes,
    'toy_dark_zurich': make_toy_dark_zurich,
    'toy_coco_o': make_toy_coco_o,
}
#: the shift family each toy shift set stands for (``--shift-root FAMILY=data/TOY``)
TOY_SHIFT_ROOTS = {'acdc': 'toy_acdc', 'foggy_cityscapes': 'toy_foggy_cityscapes',
                   'dark_zurich': 'toy_dark_zurich', 'coco_o': 'toy_coco_o'}

_MARKER = '.mmrobust_toy.json'


#: What a toy set's generator writes, by version: a copy of an older one is generated again.
_VERSIONS = {'toy_cityscapes': 2}  # 2: instanceIds and the instances' COCO annotations


def generate_toy_dataset(name: str, root: str, seed: int = 0,
                         force: bool = False) -> Dict[str, int]:
    """Generate toy dataset ``name`` into ``root`` unless a complete copy with this seed is there.

    A marker file written last records the seed, counts and the generator's version, so an
    interrupted run is redone, a copy an older generator wrote is written again, and a complete
    one is skipped.
    """
    if name not in TOY_DATASETS:
        raise UnknownNameError(f'unknown toy dataset {name!r}; choose from {sorted(TOY_DATASETS)}')
    marker = osp.join(root, _MARKER)
    if not force and osp.isfile(marker):
        with open(marker) as f:
            info = json.load(f)
        if info.get('seed') == seed and info.get('version', 1) == _VERSIONS.get(name, 1):
            return info['counts']
    counts = TOY_DATASETS[name](root, seed=seed)
    _write_json(marker, dict(name=name, seed=seed, counts=counts, version=_VERSIONS.get(name, 1)))
    return counts
