"""Per-image statistics of a cell's metric, and the metric recomputed on reweighted images.

The bootstrap (:mod:`.uncertainty`) resamples a cell's images many times. Rerunning the metric
per replicate would cost a whole evaluation each, so each metric keeps, once per cell, what it
needs per image, and :class:`CocoAP` / :class:`IoUStats` recompute the metric for integer image
weights (how often the replicate drew each image):

- COCO AP: pycocotools' ``evaluateImg`` matches each image once; its detections (score, rank in
  the image, matched / ignored per IoU threshold) and its non-ignored ground-truth counts per
  category and area range are kept, and ``accumulate`` is redone with weights (a detection drawn
  twice counts twice). With all weights 1 it gives pycocotools' numbers.
- mIoU (and mAcc, aAcc, mDice, mFscore, ...): the per-image intersection, union, predicted and
  label areas per class; weighted sums replace the sums.

Each cell's statistics go to ``<results stem>_per_image/<corruption>_<severity>.npz`` (written
atomically), next to the results file.
"""
import json
import os.path as osp
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..utils.io import atomic_write

__all__ = ['PER_IMAGE_KEY', 'STATS_FORMAT', 'CocoAP', 'IoUStats', 'coco_block', 'iou_block',
           'load_cell_stats', 'save_cell_stats', 'scorer', 'stats_dir', 'stats_path']

#: Key of a metric's ``compute_metrics`` output that carries its per-image blocks (popped
#: before the numbers are recorded).
PER_IMAGE_KEY = '__per_image__'
STATS_FORMAT = 'mmrobust-per-image/1'
# mmdet's CocoMetric item -> (IoU threshold or None for all, area label, index into maxDets
# or the number itself), as pycocotools' _summarizeDets computes stats[0:6]
_COCO_ITEMS = {'mAP': (None, 'all', 100), 'mAP_50': (.5, 'all', 2), 'mAP_75': (.75, 'all', 2),
               'mAP_s': (None, 'small', 2), 'mAP_m': (None, 'medium', 2),
               'mAP_l': (None, 'large', 2)}


def stats_dir(results_path: str) -> str:
    """``<results stem>_per_image/`` next to the results file."""
    return f'{osp.splitext(osp.abspath(results_path))[0]}_per_image'


def stats_path(folder: str, corruption: str, severity: int) -> str:
    return osp.join(folder, f'{corruption}_{severity}.npz')


# -- what the metrics keep -------------------------------------------------------------------------

def _eval_imgs(coco_eval: Any) -> Iterator[Tuple[int, dict]]:
    """``(index, evalImg)`` of pycocotools' ``evalImgs`` (category, area range, image order)
    that are not None, of an evaluated COCOeval. faster-coco-eval keeps them in C++ only, so for
    it they are recomputed from its IoUs (the pairs with ground truth or detections only)."""
    if getattr(coco_eval, 'evalImgs', None):
        yield from ((i, e) for i, e in enumerate(coco_eval.evalImgs) if e is not None)
        return
    if not hasattr(coco_eval, 'gt_dataset'):
        raise TypeError(f'{type(coco_eval).__name__} keeps no per-image evaluation (evalImgs)')
    p = coco_eval.params
    if not p.useCats:
        raise TypeError('per-image statistics of faster-coco-eval need useCats')
    img_index = {img: i for i, img in enumerate(p.imgIds)}
    cat_index = {cat: k for k, cat in enumerate(p.catIds)}
    pairs = {(a['image_id'], a['category_id']) for coco in (coco_eval.cocoGt, coco_eval.cocoDt)
             for a in coco.anns.values()
             if a['image_id'] in img_index and a['category_id'] in cat_index}
    n_img, n_area = len(p.imgIds), len(p.areaRng)
    found = []
    for img, cat in pairs:
        gts = coco_eval.gt_dataset.get_instances([img], [cat], True)[0][0]
        dts = coco_eval.dt_dataset.get_instances([img], [cat], True)[0][0]
        for a, a_rng in enumerate(p.areaRng):
            e = _evaluate_img(gts, dts, coco_eval.ious.get((img, cat), []), a_rng,
                              p.maxDets[-1], p.iouThrs)
            if e is not None:
                found.append(((cat_index[cat] * n_area + a) * n_img + img_index[img], e))
    yield from sorted(found, key=lambda item: item[0])


def _evaluate_img(gt: list, dt: list, ious, a_rng, max_det: int, iou_thrs) -> Optional[dict]:
    """pycocotools' ``COCOeval.evaluateImg`` for one image and category (its greedy matching,
    ties and ignore rules), on the IoUs of its dt sorted by score and truncated to ``max_det``."""
    if not gt and not dt:
        return None
    g_ignore = [int(g.get('ignore', g.get('iscrowd', 0)) or g['area'] < a_rng[0]
                    or g['area'] > a_rng[1]) for g in gt]
    gtind = np.argsort(g_ignore, kind='mergesort')
    gt = [gt[i] for i in gtind]
    gt_ig = np.array([g_ignore[i] for i in gtind])
    dtind = np.argsort([-d['score'] for d in dt], kind='mergesort')
    dt = [dt[i] for i in dtind[:max_det]]
    iscrowd = [int(g.get('iscrowd', 0)) for g in gt]
    ious = np.asarray(ious)[:, gtind] if len(ious) > 0 else ious
    t_count, g_count, d_count = len(iou_thrs), len(gt), len(dt)
    gtm, dtm = np.zeros((t_count, g_count)), np.zeros((t_count, d_count))
    dt_ig = np.zeros((t_count, d_count))
    if len(ious):
        for tind, t in enumerate(iou_thrs):
            for dind, d in enumerate(dt):
                iou, m = min(t, 1 - 1e-10), -1
                for gind in range(g_count):
                    if gtm[tind, gind] > 0 and not iscrowd[gind]:
                        continue
                    if m > -1 and gt_ig[m] == 0 and gt_ig[gind] == 1:
                        break
                    if ious[dind, gind] < iou:
                        continue
                    iou, m = ious[dind, gind], gind
                if m == -1:
                    continue
                dt_ig[tind, dind] = gt_ig[m]
                dtm[tind, dind] = gt[m]['id']
                gtm[tind, m] = d['id']
    outside = np.array([d['area'] < a_rng[0] or d['area'] > a_rng[1] for d in dt]
                       ).reshape(1, d_count)
    dt_ig = np.logical_or(dt_ig, np.logical_and(dtm == 0, np.repeat(outside, t_count, 0)))
    return {'dtScores': [d['score'] for d in dt], 'dtMatches': dtm, 'dtIgnore': dt_ig,
            'gtIgnore': gt_ig}


def coco_block(coco_eval: Any, metric_prefix: str) -> Dict[str, Any]:
    """What :class:`CocoAP` needs of an evaluated COCOeval, as flat arrays.

    Detections that are ignored at every IoU threshold (they count neither way) are dropped.
    """
    p = coco_eval.params
    cats = p.catIds if p.useCats else [-1]
    n_img, n_area = len(p.imgIds), len(p.areaRng)
    group, img, rank, score, tp, ig = [], [], [], [], [], []
    np_group, np_img, np_count = [], [], []
    for index, e in _eval_imgs(coco_eval):
        g, i = divmod(index, n_img)  # g = category * n_area + area
        npig = int(np.count_nonzero(np.asarray(e['gtIgnore']) == 0))
        if npig:
            np_group.append(g)
            np_img.append(i)
            np_count.append(npig)
        matched = np.asarray(e['dtMatches']) != 0
        ignored = np.asarray(e['dtIgnore'], dtype=bool)
        keep = ~ignored.all(0)
        for d in np.flatnonzero(keep):
            group.append(g)
            img.append(i)
            rank.append(d)
            score.append(e['dtScores'][d])
        tp.append(matched[:, keep].T)
        ig.append(ignored[:, keep].T)
    t_count = len(p.iouThrs)
    return {
        'kind': 'coco', 'metric_prefix': metric_prefix,
        'images': np.array([str(i) for i in p.imgIds]),
        'groups': np.array([len(cats) * n_area]), 'areas': np.array(list(p.areaRngLbl)),
        'iou_thrs': np.asarray(p.iouThrs, dtype=np.float64),
        'rec_thrs': np.asarray(p.recThrs, dtype=np.float64),
        'max_dets': np.asarray(p.maxDets, dtype=np.int64),
        'group': np.asarray(group, dtype=np.int32), 'img': np.asarray(img, dtype=np.int32),
        'rank': np.asarray(rank, dtype=np.int32), 'score': np.asarray(score, dtype=np.float64),
        'tp': np.concatenate(tp) if tp else np.zeros((0, t_count), bool),
        'ig': np.concatenate(ig) if ig else np.zeros((0, t_count), bool),
        'npig_group': np.asarray(np_group, dtype=np.int32),
        'npig_img': np.asarray(np_img, dtype=np.int32),
        'npig_count': np.asarray(np_count, dtype=np.int64)}


def iou_block(areas: Sequence[Sequence], images: Sequence[str], metric_prefix: str,
              beta: float = 1.0) -> Dict[str, Any]:
    """What :class:`IoUStats` needs: per image the (intersection, union, prediction, label)
    areas per class, as mmseg's ``IoUMetric`` collects them."""
    stacked = [np.stack([np.asarray(a[j], dtype=np.float64) for a in areas]) if areas
               else np.zeros((0, 0)) for j in range(4)]
    return {'kind': 'iou', 'metric_prefix': metric_prefix, 'images': np.array(list(images)),
            'intersect': stacked[0], 'union': stacked[1], 'pred': stacked[2],
            'label': stacked[3], 'beta': np.array([beta], dtype=np.float64)}


# -- the metric on weighted images -----------------------------------------------------------------

class IoUStats:
    """mmseg's aAcc / mIoU / mAcc / mDice / mFscore / mPrecision / mRecall (in %, unrounded)
    for image weights."""

    def __init__(self, block: Mapping[str, Any]) -> None:
        self.prefix = str(block['metric_prefix'])
        self.areas = [np.asarray(block[k], dtype=np.float64)
                      for k in ('intersect', 'union', 'pred', 'label')]
        self.beta = float(np.asarray(block['beta']).reshape(-1)[0])
        self.images = [str(i) for i in block['images']]

    def names(self) -> List[str]:
        return [self.prefix + n for n in ('aAcc', 'mIoU', 'mAcc', 'mDice', 'mFscore',
                                          'mPrecision', 'mRecall')]

    def values(self, weights: np.ndarray) -> Dict[str, np.ndarray]:
        """``{name: (R,)}`` for weights ``(R, N)``."""
        i, u, p, lab = (weights @ a for a in self.areas)  # (R, C)
        with np.errstate(divide='ignore', invalid='ignore'):
            precision, recall = i / p, i / lab
            b2 = self.beta ** 2
            per_class = {
                'mIoU': i / u, 'mAcc': recall, 'mDice': 2 * i / (p + lab),
                'mFscore': (1 + b2) * precision * recall / (b2 * precision + recall),
                'mPrecision': precision, 'mRecall': recall}
            out = {self.prefix + 'aAcc': 100 * i.sum(1) / lab.sum(1)}
            for name, v in per_class.items():
                out[self.prefix + name] = 100 * _nanmean_rows(v)
        return out


def _nanmean_rows(v: np.ndarray) -> np.ndarray:
    ok = ~np.isnan(v)
    count = ok.sum(1)
    total = np.where(ok, v, 0).sum(1)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


class CocoAP:
    """mmdet's COCO AP items (``mAP``, ``mAP_50``, ``mAP_75``, ``mAP_s/m/l``; in [0, 1],
    unrounded) for image weights: pycocotools' ``accumulate`` and ``summarize`` with every
    detection and ground truth of an image counted as often as the image's weight."""

    def __init__(self, block: Mapping[str, Any]) -> None:
        self.prefix = str(block['metric_prefix'])
        self.images = [str(i) for i in block['images']]
        self.groups = int(np.asarray(block['groups']).reshape(-1)[0])
        self.areas = [str(a) for a in block['areas']]
        self.iou_thrs = np.asarray(block['iou_thrs'], dtype=np.float64)
        self.rec_thrs = np.asarray(block['rec_thrs'], dtype=np.float64)
        self.max_dets = [int(m) for m in block['max_dets']]
        group = np.asarray(block['group'], dtype=np.int64)
        # pycocotools concatenates a group's detections image by image, then sorts by score
        # (stable): the same order here, with the groups one after another
        order = np.lexsort((np.arange(len(group)), -np.asarray(block['score']), group))
        self.group, self.img = group[order], np.asarray(block['img'], dtype=np.int64)[order]
        self.rank = np.asarray(block['rank'])[order]
        tp, ig = np.asarray(block['tp'], bool)[order], np.asarray(block['ig'], bool)[order]
        self.tp, self.fp = tp & ~ig, ~tp & ~ig
        self.start = np.searchsorted(self.group, np.arange(self.groups), 'left')
        self.end = np.searchsorted(self.group, np.arange(self.groups), 'right')
        self.np_group = np.asarray(block['npig_group'], dtype=np.int64)
        self.np_img = np.asarray(block['npig_img'], dtype=np.int64)
        self.np_count = np.asarray(block['npig_count'], dtype=np.float64)
        # groups with ground truth in some image (pycocotools' -1 for the rest stays -1)
        self.n_cat = self.groups // max(len(self.areas), 1)

    def names(self) -> List[str]:
        return [self.prefix + n for n in _COCO_ITEMS]

    def _max_det(self, item: str) -> Optional[int]:
        _, _, m = _COCO_ITEMS[item]
        if m == 100:
            return 100 if 100 in self.max_dets else None
        return self.max_dets[m] if len(self.max_dets) > m else None

    def precision(self, w: np.ndarray, max_det: int) -> np.ndarray:
        """pycocotools' ``eval['precision'][:, :, k, a, m]`` for one weight vector:
        ``(T, len(rec_thrs), groups)``, -1 where a group has no (weighted) ground truth."""
        n_t, n_r, n_g = len(self.iou_thrs), len(self.rec_thrs), self.groups
        npig = np.bincount(self.np_group, weights=w[self.np_img] * self.np_count, minlength=n_g)
        out = np.full((n_t, n_r, n_g), -1.0)
        ew = w[self.img] * (self.rank < max_det)
        has_gt = npig > 0
        seg = self.group
        off_up = 2.0 * seg  # keeps the groups' recall (in [0, 1]) apart for one search
        off_down = 2.0 * (n_g - 1 - seg)  # ... and their precision for one running max
        queries = (self.rec_thrs[None, :] + 2.0 * np.arange(n_g)[:, None])  # (G, R)
        starts, ends = self.start[:, None], self.end[:, None]
        denom = np.where(has_gt, npig, 1.0)[seg]
        for t in range(n_t):
            tp = _segment_cumsum(ew * self.tp[:, t], self.start, seg)
            fp = _segment_cumsum(ew * self.fp[:, t], self.start, seg)
            rc = np.where(has_gt[seg], tp / denom, 0.0)
            pr = tp / (fp + tp + np.spacing(1))
            env = np.maximum.accumulate((pr + off_down)[::-1])[::-1] - off_down
            pos = np.searchsorted(rc + off_up, queries.ravel(), 'left').reshape(n_g, n_r)
            pos = _exact_positions(pos, rc, self.rec_thrs[None, :], starts, ends)
            valid = pos < ends
            q = np.where(valid, env[np.minimum(pos, max(len(env) - 1, 0))] if len(env)
                         else 0.0, 0.0)
            out[t] = np.where(has_gt[None, :], q.T, -1.0)
        return out

    def values(self, weights: np.ndarray) -> Dict[str, np.ndarray]:
        """``{name: (R,)}`` for weights ``(R, N)``."""
        items = list(_COCO_ITEMS)
        out = {self.prefix + n: np.empty(len(weights)) for n in items}
        for r, w in enumerate(np.asarray(weights, dtype=np.float64)):
            cache: Dict[int, np.ndarray] = {}
            for item in items:
                thr, area, _ = _COCO_ITEMS[item]
                m = self._max_det(item)
                if m is None or area not in self.areas:
                    out[self.prefix + item][r] = -1.0
                    continue
                if m not in cache:
                    cache[m] = self.precision(w, m)
                prec = cache[m].reshape(len(self.iou_thrs), len(self.rec_thrs), self.n_cat,
                                        len(self.areas))[..., self.areas.index(area)]
                if thr is not None:
                    hits = np.flatnonzero(self.iou_thrs == thr)
                    if not len(hits):
                        hits = np.flatnonzero(np.isclose(self.iou_thrs, thr))
                    prec = prec[hits]
                s = prec[prec > -1]
                out[self.prefix + item][r] = float(np.mean(s)) if s.size else -1.0
        return out


def _segment_cumsum(x: np.ndarray, start: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Cumulative sums restarting at each group (integer-valued sums: exact)."""
    c = np.concatenate([[0.0], np.cumsum(x)])
    return c[1:] - c[start[seg]] if len(x) else c[1:]


def _exact_positions(pos: np.ndarray, rc: np.ndarray, thr: np.ndarray, starts: np.ndarray,
                     ends: np.ndarray) -> np.ndarray:
    """pycocotools' ``searchsorted(rc, thr, 'left')`` within each group: the offset search is
    exact up to rounding, so step to the first recall >= thr where rounding put it off by one."""
    pos = np.clip(pos, starts, ends)
    if not len(rc):
        return pos
    for _ in range(len(rc) + 1):
        back = (pos > starts) & (rc[np.maximum(pos - 1, 0)] >= thr)
        ahead = (pos < ends) & (rc[np.minimum(pos, len(rc) - 1)] < thr)
        if not (back.any() or ahead.any()):
            break
        pos = pos - back + ahead
    return pos


def scorer(block: Mapping[str, Any]):
    """The :class:`CocoAP` or :class:`IoUStats` of a stored block."""
    kind = str(np.asarray(block['kind']).reshape(-1)[0])
    if kind == 'coco':
        return CocoAP(block)
    if kind == 'iou':
        return IoUStats(block)
    raise ValueError(f'unknown per-image statistics kind {kind!r}')


# -- the side file ---------------------------------------------------------------------------------

def save_cell_stats(path: str, cell: Sequence, fingerprint: str,
                    blocks: Sequence[Mapping[str, Any]]) -> None:
    """Write a cell's blocks atomically as one compressed ``.npz`` (no pickled objects)."""
    arrays: Dict[str, np.ndarray] = {}
    for j, block in enumerate(blocks):
        for key, value in block.items():
            arrays[f'{j}.{key}'] = np.asarray(value)
    meta = {'format': STATS_FORMAT, 'cell': [cell[0], int(cell[1])], 'fingerprint': fingerprint,
            'blocks': len(blocks)}
    arrays['meta'] = np.array(json.dumps(meta))
    with atomic_write(path, 'wb') as f:
        np.savez_compressed(f, **arrays)


def load_cell_stats(path: str) -> Dict[str, Any]:
    """``{'meta': {...}, 'blocks': [{key: array}, ...]}`` of a side file."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data['meta']))
        if meta.get('format') != STATS_FORMAT:
            raise ValueError(f'{path} is not a per-image statistics file of {STATS_FORMAT}')
        blocks: List[Dict[str, Any]] = [{} for _ in range(meta['blocks'])]
        for key in data.files:
            if key != 'meta':
                j, name = key.split('.', 1)
                blocks[int(j)][name] = data[key]
    return {'meta': meta, 'blocks': blocks}
