"""pycocotools' per-image matching (``COCOeval.evaluateImg``) as one compiled loop over every
(image, category) pair of a cell (numba, cached on disk).

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
        g_off, d_off: (P + 1,) offsets of each pair's ground truth / detections in the flat
            arrays; iou_off: (P + 1,) offsets of each pair's D x G IoU matrix (row-major) in
            ``ious`` (an empty matrix when the pair lacks either side).
        g_area, g_crowd, g_id: per ground truth; d_area, d_id: per detection.
        area_rng: (A, 2) area ranges; thrs: (T,) IoU thresholds.

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
