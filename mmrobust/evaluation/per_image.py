"""Per-image statistics of a cell's metric, and the metric recomputed on reweighted images.

The bootstrap (:mod:`.uncertainty`) resamples a cell's images many times. Rerunning the metric
per replicate would cost a whole evaluation each, so each metric keeps, once per cell, what it
needs per image, and :class:`CocoAP` / :class:`IoUStats` recompute the metric for integer image
weights (how often the replicate drew each image):

- COCO AP: pycocotools' per-image matching (``evaluateImg``), done once per cell by a compiled
  loop (:mod:`._match`) from the IoUs the evaluation computed; the detections (score, rank in
  the image, matched / ignored per IoU threshold) and the non-ignored ground-truth counts per
  image, category and area range are kept, and ``accumulate`` is redone with weights (a
  detection drawn twice counts twice). With all weights 1 it gives pycocotools' numbers.
- mIoU (and mAcc, aAcc, mDice, mFscore, ...): the per-image intersection, union, predicted and
  label areas per class; weighted sums replace the sums.

Each cell's statistics go to ``<results stem>_per_image/<corruption>_<severity>.npz`` (written
atomically), next to the results file.
"""
import json
import os
import os.path as osp
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..utils.io import atomic_write
from .results import ResultsLayout

__all__ = ['PER_IMAGE_KEY', 'STATS_FORMAT', 'CocoAP', 'IoUStats', 'StatsTarget', 'coco_block',
           'has_stats', 'iou_block', 'load_cell_stats', 'save_cell_stats', 'scorer', 'stats_dir',
           'stats_folders', 'stats_path', 'write_cell_stats']

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
    """``<results stem>_per_image/`` next to the results file (:class:`~.results.ResultsLayout`)."""
    return ResultsLayout(results_path).per_image


def stats_path(folder: str, corruption: str, severity: int) -> str:
    """Where a cell's per-image statistics file lives in ``folder``."""
    return ResultsLayout.cell_file(folder, corruption, severity, 'npz')


def stats_folders(results_path: str, results: Mapping) -> List[str]:
    """Where a results file's per-image statistics are.

    Its own folder comes first, then those of the shards it was merged from (by their recorded path,
    or beside the merged file).
    """
    folders = [stats_dir(results_path)]
    base = osp.dirname(osp.abspath(results_path))
    for shard in results.get('merged_from') or []:
        path = shard.get('path') or ''
        for candidate in (path, osp.join(base, osp.basename(path))):
            folder = stats_dir(candidate)
            if folder not in folders and osp.isdir(folder):
                folders.append(folder)
    return folders


# -- what the metrics keep -------------------------------------------------------------------------

def coco_block(coco_eval: Any, metric_prefix: str) -> Dict[str, Any]:
    """What :class:`CocoAP` needs of an evaluated COCOeval, as flat arrays.

    pycocotools' per-image matching, from the IoUs the evaluation computed (pycocotools and
    faster-coco-eval keep them), by one compiled loop (:mod:`._match`); a COCOeval without
    them (mmdet's COCOevalMP) is read from its ``evalImgs``. Detections that are ignored at
    every IoU threshold (they count neither way) are dropped.
    """
    p = coco_eval.params
    if p.useCats and isinstance(getattr(coco_eval, 'ious', None), dict) and coco_eval.ious:
        arrays = _matched_arrays(coco_eval)
    else:
        arrays = _eval_imgs_arrays(coco_eval)
    cats = p.catIds if p.useCats else [-1]
    return {
        'kind': 'coco', 'metric_prefix': metric_prefix,
        'images': np.array([str(i) for i in p.imgIds]),
        'groups': np.array([len(cats) * len(p.areaRng)]), 'areas': np.array(list(p.areaRngLbl)),
        'iou_thrs': np.asarray(p.iouThrs, dtype=np.float64),
        'rec_thrs': np.asarray(p.recThrs, dtype=np.float64),
        'max_dets': np.asarray(p.maxDets, dtype=np.int64), **arrays}


def _matched_arrays(coco_eval: Any) -> Dict[str, np.ndarray]:
    """The block's detection and ground-truth arrays from the evaluation's IoUs."""
    from ._match import match_pairs
    p = coco_eval.params
    img_index = {img: i for i, img in enumerate(p.imgIds)}
    cat_index = {cat: k for k, cat in enumerate(p.catIds)}
    n_area, max_det = len(p.areaRng), p.maxDets[-1]

    def table(coco, keys):
        # NOTE: the order evaluate() reads them in (loadAnns(getAnnIds(...))), which orders the
        # columns (ground truth) and ties (detections) of its IoU matrices
        anns = coco.loadAnns(coco.getAnnIds(imgIds=p.imgIds, catIds=p.catIds))
        anns = [a for a in anns if a['image_id'] in img_index and a['category_id'] in cat_index]
        cols = {k: np.array([float(a.get(k, 0) or 0) for a in anns]) for k in keys}
        cols['img'] = np.array([img_index[a['image_id']] for a in anns], dtype=np.int64)
        cols['cat'] = np.array([cat_index[a['category_id']] for a in anns], dtype=np.int64)
        return cols

    gt = table(coco_eval.cocoGt, ('area', 'iscrowd', 'id'))
    dt = table(coco_eval.cocoDt, ('area', 'score', 'id'))
    n_cat = len(p.catIds)
    g_key, d_key = gt['img'] * n_cat + gt['cat'], dt['img'] * n_cat + dt['cat']
    g_order = np.lexsort((np.arange(len(g_key)), g_key))
    d_order = np.lexsort((np.arange(len(d_key)), -dt['score'], d_key))  # pycocotools' sort
    g_key, d_key = g_key[g_order], d_key[d_order]
    gt = {k: v[g_order] for k, v in gt.items()}
    dt = {k: v[d_order] for k, v in dt.items()}
    # rank within the pair; pycocotools keeps the best maxDets[-1]
    d_start = np.searchsorted(d_key, d_key, 'left')
    rank = np.arange(len(d_key)) - d_start
    keep = rank < max_det
    dt = {k: v[keep] for k, v in dt.items()}
    d_key, rank = d_key[keep], rank[keep]
    keys = np.union1d(g_key, d_key)
    g_off = np.searchsorted(g_key, keys, 'left')
    d_off = np.searchsorted(d_key, keys, 'left')
    g_off = np.append(g_off, len(g_key))
    d_off = np.append(d_off, len(d_key))
    blocks, iou_off = [], [0]
    for pair, key in enumerate(keys):
        img, cat = p.imgIds[key // n_cat], p.catIds[key % n_cat]
        iou = coco_eval.ious.get((img, cat), [])
        n_g, n_d = g_off[pair + 1] - g_off[pair], d_off[pair + 1] - d_off[pair]
        if len(iou) and n_g and n_d:
            iou = np.asarray(iou, dtype=np.float64)
            if iou.shape != (n_d, n_g):
                raise ValueError(f'the IoUs of image {img}, category {cat} are {iou.shape}, '
                                 f'not {(n_d, n_g)} (detections x ground truth)')
            blocks.append(iou.ravel())
            iou_off.append(iou_off[-1] + iou.size)
        else:
            iou_off.append(iou_off[-1])
    matched, ignored, npig = match_pairs(
        g_off, d_off, np.asarray(iou_off, dtype=np.int64),
        np.concatenate(blocks) if blocks else np.zeros(0), gt['area'], gt['iscrowd'] > 0,
        gt['id'].astype(np.int64), dt['area'], dt['id'].astype(np.int64),
        np.asarray(p.areaRng, dtype=np.float64), np.asarray(p.iouThrs, dtype=np.float64))
    cols: Dict[str, List[np.ndarray]] = {k: [] for k in ('group', 'img', 'rank', 'score', 'tp',
                                                         'ig')}
    for a in range(n_area):
        counted = ~ignored[a].all(0)
        cols['group'].append(dt['cat'][counted] * n_area + a)
        cols['img'].append(dt['img'][counted])
        cols['rank'].append(rank[counted])
        cols['score'].append(dt['score'][counted])
        cols['tp'].append(matched[a][:, counted].T)
        cols['ig'].append(ignored[a][:, counted].T)
    pair_img, pair_cat = keys // n_cat, keys % n_cat
    has = np.nonzero(npig)
    return {
        'group': np.concatenate(cols['group']).astype(np.int32),
        'img': np.concatenate(cols['img']).astype(np.int32),
        'rank': np.concatenate(cols['rank']).astype(np.int32),
        'score': np.concatenate(cols['score']).astype(np.float64),
        'tp': np.concatenate(cols['tp']), 'ig': np.concatenate(cols['ig']),
        'npig_group': (pair_cat[has[0]] * n_area + has[1]).astype(np.int32),
        'npig_img': pair_img[has[0]].astype(np.int32),
        'npig_count': npig[has].astype(np.int64)}


def _eval_imgs_arrays(coco_eval: Any) -> Dict[str, np.ndarray]:
    """The block's arrays from pycocotools' ``evalImgs`` (category, area range, image order)."""
    p = coco_eval.params
    n_img, t_count = len(p.imgIds), len(p.iouThrs)
    group, img, rank, score, tp, ig = [], [], [], [], [], []
    np_group, np_img, np_count = [], [], []
    for index, e in enumerate(coco_eval.evalImgs):
        if e is None:
            continue
        g, i = divmod(index, n_img)  # g = category * n_area + area
        npig = int(np.count_nonzero(np.asarray(e['gtIgnore']) == 0))
        if npig:
            np_group.append(g)
            np_img.append(i)
            np_count.append(npig)
        ignored = np.asarray(e['dtIgnore'], dtype=bool).reshape(t_count, -1)
        keep = np.flatnonzero(~ignored.all(0))
        group.append(np.full(len(keep), g))
        img.append(np.full(len(keep), i))
        rank.append(keep)
        score.append(np.asarray(e['dtScores'], dtype=np.float64)[keep])
        tp.append((np.asarray(e['dtMatches']).reshape(t_count, -1) != 0)[:, keep].T)
        ig.append(ignored[:, keep].T)

    def cat(parts, dtype, shape=(0, )):
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(shape, dtype)
    return {'group': cat(group, np.int32), 'img': cat(img, np.int32),
            'rank': cat(rank, np.int32), 'score': cat(score, np.float64),
            'tp': cat(tp, bool, (0, t_count)), 'ig': cat(ig, bool, (0, t_count)),
            'npig_group': np.asarray(np_group, dtype=np.int32),
            'npig_img': np.asarray(np_img, dtype=np.int32),
            'npig_count': np.asarray(np_count, dtype=np.int64)}


def iou_block(areas: Sequence[Sequence], images: Sequence[str], metric_prefix: str,
              beta: float = 1.0) -> Dict[str, Any]:
    """What :class:`IoUStats` needs.

    Per image the (intersection, union, prediction, label) areas per class, as mmseg's ``IoUMetric``
    collects them.
    """
    stacked = [np.stack([np.asarray(a[j], dtype=np.float64) for a in areas]) if areas
               else np.zeros((0, 0)) for j in range(4)]
    return {'kind': 'iou', 'metric_prefix': metric_prefix, 'images': np.array(list(images)),
            'intersect': stacked[0], 'union': stacked[1], 'pred': stacked[2],
            'label': stacked[3], 'beta': np.array([beta], dtype=np.float64)}


# -- the metric on weighted images -----------------------------------------------------------------

class IoUStats:
    """mmseg's IoU metrics for image weights.

    mmseg's aAcc / mIoU / mAcc / mDice / mFscore / mPrecision / mRecall (in %, unrounded) for image
    weights.
    """

    def __init__(self, block: Mapping[str, Any]) -> None:
        self.prefix = str(block['metric_prefix'])
        self.areas = [np.asarray(block[k], dtype=np.float64)
                      for k in ('intersect', 'union', 'pred', 'label')]
        self.beta = float(np.asarray(block['beta']).reshape(-1)[0])
        self.images = [str(i) for i in block['images']]

    def names(self) -> List[str]:
        """The metric names, with the prefix."""
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
    """mmdet's COCO AP items for image weights.

    ``mAP``, ``mAP_50``, ``mAP_75``, ``mAP_s/m/l`` (in [0, 1], unrounded): pycocotools'
    ``accumulate`` and ``summarize`` with every detection and ground truth of an image counted
    as often as the image's weight.
    """

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
        self.deepest = int(self.rank.max()) + 1 if len(self.rank) else 0
        tp, ig = np.asarray(block['tp'], bool)[order], np.asarray(block['ig'], bool)[order]
        # per IoU threshold and detection: 0 ignored, 1 false positive, 2 true positive
        self.state = np.ascontiguousarray(np.where(ig, 0, np.where(tp, 2, 1)).T.astype(np.int8))
        self.start = np.searchsorted(self.group, np.arange(self.groups + 1), 'left')
        self.np_group = np.asarray(block['npig_group'], dtype=np.int64)
        self.np_img = np.asarray(block['npig_img'], dtype=np.int64)
        self.np_count = np.asarray(block['npig_count'], dtype=np.float64)
        # groups with ground truth in some image (pycocotools' -1 for the rest stays -1)
        self.n_cat = self.groups // max(len(self.areas), 1)

    def names(self) -> List[str]:
        """The metric names, with the prefix."""
        return [self.prefix + n for n in _COCO_ITEMS]

    def _max_det(self, item: str) -> Optional[int]:
        _, _, m = _COCO_ITEMS[item]
        if m == 100:
            return 100 if 100 in self.max_dets else None
        return self.max_dets[m] if len(self.max_dets) > m else None

    def precision(self, w: np.ndarray, max_det: int) -> np.ndarray:
        """pycocotools' ``eval['precision'][:, :, k, a, m]`` for one weight vector.

        ``(T, len(rec_thrs), groups)``, -1 where a group has no (weighted) ground truth.
        """
        from ._match import weighted_precision
        n_g = self.groups
        npig = np.bincount(self.np_group, weights=w[self.np_img] * self.np_count, minlength=n_g)
        out = np.empty((len(self.iou_thrs), len(self.rec_thrs), n_g))
        weighted_precision(w[self.img] * (self.rank < max_det), self.state, self.start, npig,
                           self.rec_thrs, out)
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
                m = min(m, self.deepest)  # NOTE: a cut below every detection is no cut
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


@dataclass(frozen=True)
class StatsTarget:
    """Where a cell's statistics go.

    The file, the cell, the fingerprint of its evaluation and the folders whose relative paths name
    an image alike in every cell (picklable: the metric worker writes the file).
    """
    path: str
    cell: Tuple[str, int]
    fingerprint: str
    image_roots: Tuple[str, ...] = ()

    def image_key(self, path: str) -> str:
        """``path`` relative to the first root it is under, else ``path``."""
        full = osp.abspath(path)
        for root in self.image_roots:
            root = osp.abspath(root)
            if full.startswith(root + os.sep):
                return osp.relpath(full, root)
        return path


def write_cell_stats(metrics: Dict[str, Any], target: StatsTarget) -> bool:
    """Pop the per-image blocks from a cell's ``metrics`` and write them to ``target`` (atomically).

    False when the metrics kept none.
    """
    blocks = metrics.pop(PER_IMAGE_KEY, None)
    if not blocks:
        return False
    for block in blocks:
        if block['kind'] == 'iou':
            block['images'] = [target.image_key(p) for p in block['images']]
    os.makedirs(osp.dirname(target.path), exist_ok=True)
    save_cell_stats(target.path, target.cell, target.fingerprint, blocks)
    return True


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


def has_stats(path: str, fingerprint: str) -> bool:
    """Whether ``path`` holds per-image statistics of the evaluation of ``fingerprint``."""
    if not osp.isfile(path):
        return False
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data['meta']))
    except (OSError, ValueError, KeyError):  # NOTE: unreadable: as good as missing
        return False
    return meta.get('format') == STATS_FORMAT and meta.get('fingerprint') == fingerprint
