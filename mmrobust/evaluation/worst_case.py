"""The per-image worst case over a run's attacks: the cell ``worst``, for segmentors.

A robustness reviewer asks how a model fares against the strongest of the attacks that were run,
image by image (as AutoAttack reports for classification). For the k-th budget ε (every attack
of a run has the same budgets), each image's worst attack is the one under which that image's
own mIoU (its intersection over union, averaged over the classes present in its label or its
prediction) is lowest; the cell ``(worst, k)`` sums, class by class, the areas of every image
under its own worst attack and scores them as mmseg's ``IoUMetric`` does (aAcc, mIoU, mAcc, ...,
in %, rounded to 2 decimals). It is computed from the attack cells' per-image statistics once
they are all recorded (at the end of a run, or by ``robustness_report.py merge`` for shards),
and its own per-image statistics are written like any cell's, so the report gives it
intervals. With one attack it is that attack's cell.

Detectors have no such cell. COCO AP ranks every detection of the test set against all the
others, so an image has no AP of its own, and "the attack that hurts this image most" would
need a per-image proxy (its recall, an AP of one image) that is another metric than the one
reported: the worst case chosen by it would not be the worst case of AP.
"""
import os
import os.path as osp
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np

from .cells import WORST
from .per_image import IoUStats, load_cell_stats, save_cell_stats, stats_dir, stats_path

__all__ = ['WORST', 'add_worst_case', 'image_miou', 'worst_case_block']
_AREAS = ('intersect', 'union', 'pred', 'label')


def image_miou(block: Mapping[str, Any]) -> np.ndarray:
    """Each image's own mIoU, (N,).

    IoU averaged over the classes with a non-empty union in that image; NaN for an image without any
    (every pixel ignored).
    """
    intersect = np.asarray(block['intersect'], dtype=np.float64)
    union = np.asarray(block['union'], dtype=np.float64)
    present = union > 0
    iou = np.where(present, intersect / np.where(present, union, 1), 0)
    count = present.sum(1)
    return np.where(count > 0, iou.sum(1) / np.maximum(count, 1), np.nan)


def worst_case_block(blocks: Sequence[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """One IoU block of the per-image worst case over the attacks.

    One IoU block whose rows are, per image, the rows of the block (one per attack, in the attacks'
    order) with the lowest image mIoU; ties and images without any class go to the first attack.
    ``chosen`` counts how often each block was chosen. None when the blocks do not hold the same
    images.
    """
    images = [str(i) for i in blocks[0]['images']]
    order = []
    for block in blocks:
        position = {str(name): row for row, name in enumerate(block['images'])}
        if set(position) != set(images) or len(position) != len(block['images']):
            return None
        order.append(np.array([position[name] for name in images], dtype=np.int64))
    scores = np.stack([image_miou(b)[rows] for b, rows in zip(blocks, order)])  # (A, N)
    choice = np.argmin(np.where(np.isnan(scores), np.inf, scores), axis=0)
    out: Dict[str, Any] = {k: v for k, v in blocks[0].items() if k not in _AREAS}
    out['images'] = np.array(images)
    for key in _AREAS:
        stacked = np.stack([np.asarray(b[key], dtype=np.float64)[rows]
                            for b, rows in zip(blocks, order)])  # (A, N, C)
        out[key] = stacked[choice, np.arange(len(images))]
    out['chosen'] = np.bincount(choice, minlength=len(blocks))
    return out


def _scores(block: Mapping[str, Any], names: Sequence[str]) -> Dict[str, float]:
    """mmseg's numbers of an IoU block (all images weighted 1), the ``names`` asked for."""
    values = IoUStats(block).values(np.ones((1, len(block['images']))))
    return {name: float(np.round(values[name][0], 2)) for name in names if name in values}


def add_worst_case(results_path: str, data: Dict, folders: Optional[Sequence[str]] = None
                   ) -> Dict[int, str]:
    """Record the per-image worst case over the attacks of a results dict.

    Record in ``data`` (a results dict, in place) the cells ``(worst, k)`` that every attack of it
    allows: two or more attacks, each with its k-th cell recorded and per-image IoU statistics;
    write their statistics next to ``results_path`` and, under ``worst_case``, how many images each
    attack was the worst for. ``folders``: where the attack cells' statistics are (default: next to
    ``results_path``). Returns ``{k: why}`` for the budgets left without one (``{}`` also when there
    is nothing to do).
    """
    from .results import evaluation_sha256
    attacks = list((data.get('attacks') or {}).keys())
    if len(attacks) < 2:
        return {}
    cells = data.setdefault('cells', {})
    folders = list(folders or [stats_dir(results_path)])
    fingerprint = evaluation_sha256(data)
    skipped: Dict[int, str] = {}
    budgets = len(data['attacks'][attacks[0]]['epsilons'])
    for k in range(1, budgets + 1):
        if str(k) in cells.get(WORST, {}):
            continue
        if any(str(k) not in cells.get(a, {}) for a in attacks):
            skipped[k] = 'not every attack cell is recorded'
            continue
        blocks = []
        for attack in attacks:
            path = next((p for p in (stats_path(f, attack, k) for f in folders)
                         if osp.isfile(p)), None)
            loaded = load_cell_stats(path) if path else None
            iou = [b for b in (loaded or {}).get('blocks', [])
                   if str(np.asarray(b['kind']).reshape(-1)[0]) == 'iou']
            if loaded is None or loaded['meta'].get('fingerprint') != fingerprint or \
                    len(iou) != 1:
                blocks = []
                break
            blocks.append(iou[0])
        if not blocks:
            skipped[k] = ('it needs every attack cell\'s per-image IoU statistics (a '
                          'segmentor\'s, without --no-per-image-stats)')
            continue
        block = worst_case_block(blocks)
        if block is None:
            skipped[k] = 'the attack cells hold different images'
            continue
        chosen = dict(zip(attacks, (int(c) for c in block.pop('chosen'))))
        names = list(cells[attacks[0]][str(k)])
        cells.setdefault(WORST, {})[str(k)] = _scores(block, names)
        # NOTE: how many images each attack was the worst for, per budget
        data.setdefault('worst_case', {})[str(k)] = chosen
        os.makedirs(folders[0], exist_ok=True)
        save_cell_stats(stats_path(folders[0], WORST, k), (WORST, k), fingerprint, [block])
    return skipped
