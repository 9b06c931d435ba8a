"""Comparisons a robustness reviewer asks for, on top of the bootstrap of :mod:`.uncertainty`.

- **Effective robustness** (Taori et al. 2020): rPC rewards a low clean score, so a model is
  compared with the trend of the baselines instead: a line fitted through the baselines'
  (P_clean, mPC) points, in the logit axes of Taori et al. (``logit``: logit(mPC) = a *
  logit(P_clean) + b, scores as fractions of the metric's scale) or in plain ones
  (``linear``). A model's effective robustness is its mPC minus the trend's mPC at its
  P_clean, in the metric's units. Its interval refits the line on every replicate (the same
  image draws for every model), so the baselines' noise is in it.
- **Per-corruption paired differences**: for each corruption, the difference of two models'
  means over severities on the same replicates, its percentile interval, a bootstrap p-value
  (twice the smaller tail of the replicated difference around 0) and Holm's step-down
  correction over the corruptions, so that "better on 12 of 15 corruptions" holds at the
  family-wise level stated.
- **Seeds inside the interval** (a two-level bootstrap): where a recipe was trained with
  several seeds, each replicate first draws the seeds with replacement within each recipe,
  then uses the replicate's image draw; the one-level interval (seeds averaged, images
  resampled) covers test-image noise only.
"""
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..utils.errors import UsageError
from .uncertainty import interval

__all__ = ['ER_AXES', 'bootstrap_p', 'effective_robustness', 'holm',
           'per_corruption_differences', 'recipe_corruption_differences',
           'seed_bootstrap_difference', 'trend_at']

ER_AXES = ('logit', 'linear')
_EPS = 1e-6


def holm(p_values: Sequence[float]) -> List[float]:
    """Holm's step-down adjusted p-values (family-wise error control), in the input order."""
    p = np.asarray(p_values, dtype=np.float64)
    order = np.argsort(p, kind='stable')
    m = len(p)
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def bootstrap_p(differences: np.ndarray) -> float:
    """Two-sided bootstrap p-value of "no difference".

    Twice the smaller share of replicated differences on either side of 0 (NaN replicates left out),
    at most 1.
    """
    d = np.asarray(differences, dtype=np.float64)
    d = d[~np.isnan(d)]
    if not d.size:
        return float('nan')
    return float(min(1.0, 2 * min(np.mean(d <= 0), np.mean(d >= 0))))


def per_corruption_differences(base: Mapping[Tuple[str, int], np.ndarray],
                               other: Mapping[Tuple[str, int], np.ndarray],
                               base_points: Mapping[str, float],
                               other_points: Mapping[str, float], confidence: float,
                               alpha: float = 0.05) -> Dict[str, Dict[str, float]]:
    """``{corruption: {difference, low, high, p, p_holm, significant}}`` of other minus base.

    Args:
        base: ``{(corruption, severity): (R,)}`` cell replicates of one metric on image draws
            shared with ``other`` (a cell of a corruption present in both).
        other: the same of the model compared with ``base``.
        base_points: each corruption's mean over severities (the point values) of ``base``.
        other_points: the same of ``other``.
        confidence: the level of the intervals (e.g. 0.95).
        alpha: the family-wise level of ``significant`` (Holm over the corruptions here).
    """
    corruptions = [c for c in dict.fromkeys(c for c, _ in base)
                   if c in base_points and c in other_points]
    rows: Dict[str, Dict[str, float]] = {}
    for c in corruptions:
        severities = sorted(s for c2, s in base if c2 == c and (c2, s) in other)
        if not severities:
            continue
        diff = (np.mean([other[(c, s)] for s in severities], axis=0)
                - np.mean([base[(c, s)] for s in severities], axis=0))
        lo, hi = interval(diff, confidence)
        rows[c] = {'difference': float(other_points[c] - base_points[c]), 'low': lo,
                   'high': hi, 'p': bootstrap_p(diff)}
    adjusted = holm([r['p'] for r in rows.values()]) if rows else []
    for row, p_adj in zip(rows.values(), adjusted):
        row['p_holm'] = p_adj
        row['significant'] = bool(p_adj <= alpha)
    return rows


def recipe_corruption_differences(base: Sequence[Mapping], other: Sequence[Mapping],
                                  base_points: Sequence[Mapping], other_points: Sequence[Mapping],
                                  name: str, confidence: float, alpha: float
                                  ) -> Dict[str, Dict[str, float]]:
    """:func:`per_corruption_differences` of two recipes over their seeds.

    :func:`per_corruption_differences` of two recipes (lists of their seeds' replicate summaries and
    point summaries, seeds averaged) for metric ``name``; empty where a seed lacks the metric's cell
    replicates.
    """
    if not all(name in r and r[name].get('cells') for r in list(base) + list(other)):
        return {}

    def cells(summaries):
        common = set.intersection(*(set(r[name]['cells']) for r in summaries))
        return {c: np.mean([r[name]['cells'][c] for r in summaries], axis=0) for c in common}

    def per_corruption(summaries):
        rows = [p['metrics'].get(name, {}).get('per_corruption', {}) for p in summaries]
        common = set.intersection(*(set(r) for r in rows))
        return {c: float(np.mean([r[c] for r in rows])) for c in common}
    return per_corruption_differences(cells(base), cells(other), per_corruption(base_points),
                                      per_corruption(other_points), confidence, alpha)


def _axis(values: np.ndarray, axis: str) -> np.ndarray:
    if axis == 'linear':
        return values
    v = np.clip(values, _EPS, 1 - _EPS)
    return np.log(v / (1 - v))


def _inverse(values: np.ndarray, axis: str) -> np.ndarray:
    return values if axis == 'linear' else 1 / (1 + np.exp(-values))


def _fit(x: np.ndarray, y: np.ndarray, axis: str) -> Tuple[float, float]:
    """Least-squares line y = a x + b in the chosen axes (x, y as fractions)."""
    a, b = np.polyfit(_axis(x, axis), _axis(y, axis), 1)
    return float(a), float(b)


def trend_at(a: float, b: float, x: np.ndarray, axis: str) -> np.ndarray:
    """The fitted trend's mPC (fraction) at clean scores ``x`` (fractions)."""
    return _inverse(a * _axis(x, axis) + b, axis)


def effective_robustness(points: Mapping[str, Tuple[float, float]], baselines: Sequence[str],
                         scale: float, axis: str = 'logit',
                         replicates: Optional[Mapping[str, Tuple[np.ndarray, np.ndarray]]] = None,
                         confidence: float = 0.95) -> Dict:
    """Each model's distance above the baselines' trend of mPC against P_clean.

    Args:
        points: ``{label: (P_clean, mPC)}`` in the metric's units.
        baselines: the labels the trend is fitted on (at least 2, with distinct P_clean).
        scale: the metric's perfect score (1 for AP, 100 for mIoU): scores are fractions of it
            in the logit axes.
        axis: ``'logit'`` (Taori et al.) or ``'linear'``.
        replicates: ``{label: (P_clean (R,), mPC (R,))}`` on shared image draws; where every
            baseline and a model have them, the model's ER gets an interval.
        confidence: the level of the intervals.

    Returns:
        ``{'axis', 'baselines', 'slope', 'intercept', 'models': {label: {'P_clean', 'mPC',
        'trend', 'ER', 'low', 'high'}}}`` (ER, trend in the metric's units; low / high NaN
        without replicates).

    Raises:
        UsageError: an unknown axis, fewer than 2 baselines, or a baseline without a point.
    """
    if axis not in ER_AXES:
        raise UsageError(f'effective robustness axis must be one of {ER_AXES}, not {axis!r}')
    missing = [b for b in baselines if b not in points]
    if missing or len(set(baselines)) < 2:
        raise UsageError('effective robustness needs at least 2 baseline models with P_clean '
                         f'and mPC (got {list(baselines)}; missing {missing}): name them with '
                         '--baselines')
    x = np.array([points[b][0] for b in baselines], dtype=np.float64) / scale
    y = np.array([points[b][1] for b in baselines], dtype=np.float64) / scale
    if np.ptp(x) <= 0:
        raise UsageError('effective robustness needs baselines with different clean scores')
    a, b = _fit(x, y, axis)
    models: Dict[str, Dict[str, float]] = {}
    usable = replicates is not None and all(bl in replicates for bl in baselines)
    for label, (p_clean, m_pc) in points.items():
        trend = float(trend_at(a, b, np.array([p_clean / scale]), axis)[0]) * scale
        row = {'P_clean': float(p_clean), 'mPC': float(m_pc), 'trend': trend,
               'ER': float(m_pc - trend), 'low': float('nan'), 'high': float('nan')}
        if usable and label in replicates:
            row['low'], row['high'] = interval(
                _er_replicates(label, baselines, replicates, scale, axis), confidence)
        models[label] = row
    return {'axis': axis, 'baselines': list(baselines), 'slope': a, 'intercept': b,
            'models': models}


def _er_replicates(label: str, baselines: Sequence[str],
                   replicates: Mapping[str, Tuple[np.ndarray, np.ndarray]], scale: float,
                   axis: str) -> np.ndarray:
    """The model's ER on every replicate, the trend refitted on the baselines' replicate."""
    xs = np.stack([replicates[bl][0] for bl in baselines]) / scale  # (B, R)
    ys = np.stack([replicates[bl][1] for bl in baselines]) / scale
    px, py = (np.asarray(v, dtype=np.float64) / scale for v in replicates[label])
    out = np.full(xs.shape[1], np.nan)
    for r in range(xs.shape[1]):
        if np.isnan(xs[:, r]).any() or np.isnan(ys[:, r]).any() or np.ptp(xs[:, r]) <= 0:
            continue
        a, b = _fit(xs[:, r], ys[:, r], axis)
        out[r] = (py[r] - trend_at(a, b, np.array([px[r]]), axis)[0]) * scale
    return out


def seed_bootstrap_difference(base: Sequence[np.ndarray], other: Sequence[np.ndarray],
                              seed: int = 0) -> np.ndarray:
    """Two-level replicates of other minus base.

    For each image replicate r, each recipe's seeds drawn with replacement (as many as it has),
    their replicate r averaged.

    Args:
        base: one ``(R,)`` array of replicates per seed of the base recipe, on image draws
            shared with ``other``.
        other: the same of the other recipe.
        seed: the seed of the draws of seeds.
    """
    b, o = np.stack(base), np.stack(other)  # (seeds, R)
    rng = np.random.default_rng(seed)
    replicates = b.shape[1]
    pick_b = rng.integers(0, len(b), (replicates, len(b)))
    pick_o = rng.integers(0, len(o), (replicates, len(o)))
    cols = np.arange(replicates)[:, None]
    return o[pick_o, cols].mean(1) - b[pick_b, cols].mean(1)
