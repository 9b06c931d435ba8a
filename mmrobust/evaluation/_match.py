"""pycocotools' per-image matching as one compiled loop.

pycocotools' per-image matching (``COCOeval.evaluateImg``) as one compiled loop over every (image,
category) pair of a cell (numba, cached on disk).

It performs pycocotools' greedy matching with its rules: ground truth sorted by its ignore flag
(stable), a detection takes the free ground truth of highest IoU at or above the threshold (ties
to the later one), crowd regions match many detections, a non-ignored match stops the search at
the first ignored object, and an unmatched detection outside the area range is ignored. Like
pycocotools, a ground-truth id of 0 reads as "unmatched" and a detection id of 0 leaves its
match free (its ids are what pycocotools compares).
"""
import numba
import numpy as np

_jit = numba.njit(cache=True, nogil=True)


@_jit
def match_pairs(g_off: np.ndarray, d_off: np.ndarray, iou_off: np.ndarray, ious: np.ndarray,
                g_area: np.ndarray, g_crowd: np.ndarray, g_id: np.ndarray, d_area: np.ndarray,
                d_id: np.ndarray, area_rng: np.ndarray, thrs: np.ndarray):
    """Match every pair's detections (sorted by score, truncated) to its ground truth.

    Args:
        g_off: (P + 1,) offsets of each pair's ground truth in the flat arrays.
        d_off: (P + 1,) offsets of each pair's detections in the flat arrays.
        iou_off: (P + 1,) offsets of each pair's D x G IoU matrix (row-major) in ``ious`` (an
            empty matrix when the pair lacks either side).
        ious: the IoU matrices, flat.
        g_area: area per ground truth.
        g_crowd: crowd flag per ground truth.
        g_id: id per ground truth.
        d_area: area per detection.
        d_id: id per detection.
        area_rng: (A, 2) area ranges.
        thrs: (T,) IoU thresholds.

    Returns:
        ``matched`` and ``ignored`` (A, T, total detections) as pycocotools' ``dtMatches != 0``
        and ``dtIgnore``, and ``npig`` (P, A): the non-ignored ground truth per pair and range.
    """
    pairs = g_off.shape[0] - 1
    n_area, n_thr = area_rng.shape[0], thrs.shape[0]
    total = d_off[pairs]
    matched = np.zeros((n_area, n_thr, total), np.bool_)
    ignored = np.zeros((n_area, n_thr, total), np.bool_)
    npig = np.zeros((pairs, n_area), np.int64)
    for p in range(pairs):
        g0, g1, d0, d1 = g_off[p], g_off[p + 1], d_off[p], d_off[p + 1]
        n_g, n_d = g1 - g0, d1 - d0
        has_iou = iou_off[p + 1] > iou_off[p]
        order = np.empty(n_g, np.int64)
        g_ig = np.zeros(n_g, np.bool_)
        taken = np.zeros(n_g, np.bool_)
        for a in range(n_area):
            lo, hi = area_rng[a, 0], area_rng[a, 1]
            for g in range(n_g):
                g_ig[g] = g_crowd[g0 + g] or g_area[g0 + g] < lo or g_area[g0 + g] > hi
            k = 0
            for g in range(n_g):  # NOTE: pycocotools' stable sort by the ignore flag
                if not g_ig[g]:
                    order[k] = g
                    k += 1
            npig[p, a] = k
            for g in range(n_g):
                if g_ig[g]:
                    order[k] = g
                    k += 1
            for t in range(n_thr):
                taken[:] = False
                thr = min(thrs[t], 1 - 1e-10)
                for d in range(n_d):
                    best = thr
                    m = -1
                    if has_iou:
                        for j in range(n_g):
                            g = order[j]
                            if taken[g] and not g_crowd[g0 + g]:
                                continue
                            if m > -1 and not g_ig[m] and g_ig[g]:
                                break
                            iou = ious[iou_off[p] + d * n_g + g]
                            if iou < best:
                                continue
                            best = iou
                            m = g
                    outside = d_area[d0 + d] < lo or d_area[d0 + d] > hi
                    if m == -1:
                        ignored[a, t, d0 + d] = outside
                        continue
                    unmatched_id = g_id[g0 + m] == 0
                    matched[a, t, d0 + d] = not unmatched_id
                    ignored[a, t, d0 + d] = g_ig[m] or (unmatched_id and outside)
                    if d_id[d0 + d] > 0:
                        taken[m] = True
    return matched, ignored, npig


@_jit
def weighted_precision(weight: np.ndarray, state: np.ndarray, start: np.ndarray,
                       npig: np.ndarray, rec_thrs: np.ndarray, out: np.ndarray) -> None:
    """pycocotools' ``accumulate`` precision (T, R, G) of weighted detections, in ``out``.

    ``weight`` (E,): each detection's count (its image's draws; 0 for one cut by maxDets);
    ``state`` (T, E): 0 ignored, 1 false positive, 2 true positive at each IoU threshold;
    detections ordered by group, and by score (stable) within it, ``start`` (G + 1,) the groups'
    offsets; ``npig`` (G,) the weighted non-ignored ground truth.

    Only true positives make points: a detection drawn k times (k copies) adds points between
    the curve's points, an ignored or weight-0 one repeats a point, and a false positive's
    precision is below the point before it, and its recall the same. None of these moves the
    first point reaching a recall threshold (recall rises at true positives only) or the
    running maximum of precision, so pycocotools' numbers come from the true positives, with
    the false positives in the counts.
    """
    n_t, n_r = state.shape[0], rec_thrs.shape[0]
    eps = np.spacing(1.0)
    longest = 0
    for g in range(start.shape[0] - 1):
        longest = max(longest, start[g + 1] - start[g])
    rc = np.empty(longest)
    pr = np.empty(longest)
    for g in range(start.shape[0] - 1):
        if npig[g] <= 0:
            out[:, :, g] = -1.0
            continue
        for t in range(n_t):
            n = 0
            tps = 0.0
            fps = 0.0
            for i in range(start[g], start[g + 1]):
                s = state[t, i]
                if s == 1:
                    fps += weight[i]
                elif s == 2 and weight[i] != 0:
                    tps += weight[i]
                    rc[n] = tps / npig[g]
                    pr[n] = tps / (fps + tps + eps)
                    n += 1
            for i in range(n - 1, 0, -1):  # the interpolated precision: max(pr[i:])
                if pr[i] > pr[i - 1]:
                    pr[i - 1] = pr[i]
            j = 0
            for r in range(n_r):  # searchsorted(rc, recThrs, 'left'), thresholds ascending
                while j < n and rc[j] < rec_thrs[r]:
                    j += 1
                out[t, r, g] = pr[j] if j < n else 0.0
