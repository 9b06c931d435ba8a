"""Tests of "other minus base" that a reviewer can trust: seeds in them, decisions that hold.

- **What varies.** Each recipe's seeds were scored on one test set, so a seed's number moves
  with its training (the seed effect, and the seed's own luck on these images) and with the
  images, which every model shares. Over seeds and test sets, the difference of recipe means
  D = mean(other's seeds) - mean(base's seeds) has the variance

      V = V_images + c sigma^2,  c = 1 / n_other + 1 / n_base

  ``sigma^2`` is the between-seed variance of the recorded numbers, estimated by ``s^2`` pooled
  over both recipes (``n_other + n_base - 2`` degrees of freedom); ``V_images`` is the bootstrap
  variance of D over the images without the seeds' own image noise (already in ``s^2``): the
  replicates' variance of each seed's deviation from its recipe's mean, times n / (n - 1),
  pooled, times c, is taken out.
- **The test.** t = D / sqrt(V_images + c s^2). Its null distribution is a normal over a scaled
  chi-square, Z sqrt((1 + rho) / (rho + chi2_df / df)) with rho = V_images / (c sigma^2): Student's
  t at rho = 0, normal as rho grows. rho is unknown, and plugging in its estimate (or
  Satterthwaite's degrees of freedom) makes the tails two to four times too heavy at Holm's
  alpha / 15, because a small ``s^2`` both inflates t and makes rho look large. So rho is taken
  at ``sigma^2``'s ``SEED_BOUND`` (99 %) upper confidence bound: at most the stated rate at alpha
  and alpha / 15 for every rho with 2 to 8 degrees of freedom (simulated in
  ``tests/test_evaluation/test_significance.py``), conservative where the images dominate.
  The interval is the same distribution's. A bootstrap of 3 seeds (10 distinct draws, a third
  of the seed variance lost) rejects a true null far more often, so the seeds are not resampled.
- **Seeds averaged** (``seeds=False``, or one seed a recipe): V = V_images, normal. The test is
  then about these checkpoints on these images, not about their recipes.
- **Monte-Carlo error.** p comes from the bootstrap's variance rather than from counting
  replicates beyond 0 (whose resolution, 2 / R, is coarser than Holm's first threshold
  alpha / m at R = 1000); its Monte-Carlo standard error is a jackknife over batches of
  replicates. A Holm decision that changes between p - 3 SE and p + 3 SE (for every test at
  once; Holm is monotone in each p) is **undecided**: its verdict would depend on
  ``--bootstrap-seed``, and more replicates settle it.
"""
import functools
import math
from typing import Dict, List, Mapping, Sequence

import numpy as np
from scipy import optimize, special, stats

__all__ = ['MC_Z', 'SEED_BOUND', 'difference_test', 'holm', 'holm_verdicts', 'null_sf']

#: Monte-Carlo standard errors either side of p within which a decision must hold
MC_Z = 3.0
#: the seeds' variance enters the null distribution at this upper confidence bound (see above)
SEED_BOUND = 0.99
_BATCHES = 20
_CHI2_GRID = 2000


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


def _pooled(groups: Sequence[np.ndarray]) -> float:
    """Pooled within-group variance (ddof 1) of several 1-D groups; NaN without freedom."""
    df = sum(len(g) - 1 for g in groups)
    if df <= 0:
        return float('nan')
    return float(sum(((g - g.mean()) ** 2).sum() for g in groups) / df)


def null_sf(t, rho, df: int):
    """P(|T| > t) for T = Z sqrt((1 + rho) / (rho + chi2_df / df)), elementwise.

    The null distribution of D / sqrt(V_images + c s^2) when the images' variance is ``rho``
    times the seeds' (``c sigma^2``): infinite ``rho`` is normal, 0 Student's t with ``df``.
    ``t`` and ``rho`` broadcast; a float for scalars.
    """
    t, rho = np.broadcast_arrays(np.asarray(t, np.float64), np.asarray(rho, np.float64))
    out = np.array(_two_sided(t), dtype=np.float64, ndmin=1)
    finite = ~np.isinf(rho).reshape(out.shape)
    if finite.any():
        tf, rf = t.reshape(out.shape)[finite][:, None], rho.reshape(out.shape)[finite][:, None]
        out[finite] = np.mean(_two_sided(tf * np.sqrt((rf + _chi2_grid(df)) / (1 + rf))),
                              axis=-1)
    return float(out[0]) if t.ndim == 0 else out.reshape(t.shape)


def _two_sided(z: np.ndarray) -> np.ndarray:
    """2 P(Z > z) of a standard normal."""
    return special.erfc(np.asarray(z) / math.sqrt(2))


@functools.lru_cache(maxsize=None)
def _chi2_grid(df: int) -> np.ndarray:
    """chi2_df / df at the midpoints of equal-probability bins (the mixture's quadrature)."""
    return stats.chi2.ppf((np.arange(_CHI2_GRID) + 0.5) / _CHI2_GRID, df) / df


def difference_test(base: Sequence[np.ndarray], other: Sequence[np.ndarray],
                    base_points: Sequence[float], other_points: Sequence[float],
                    confidence: float, seeds: bool) -> Dict[str, float]:
    """Other minus base: the difference, its interval, p and p's Monte-Carlo error.

    Args:
        base: one ``(R,)`` array of bootstrap replicates per seed of the base recipe, on image
            draws shared with ``other`` (NaN: a replicate without a value).
        other: the same of the other recipe.
        base_points: each seed's recorded number (the point values), in the order of ``base``.
        other_points: the same of ``other``.
        confidence: the level of the interval.
        seeds: include the between-seed variance (needs a recipe with two seeds or more);
            otherwise the seeds are averaged and only the images vary.

    Returns:
        ``{'difference', 'low', 'high', 'p', 'p_se', 'seed_df', 'replicates'}``: ``seed_df`` is 0
        where only the images vary (a normal test); ``p_se`` NaN with fewer than 10 replicates.
    """
    b, o = np.stack(base).astype(np.float64), np.stack(other).astype(np.float64)
    usable = ~(np.isnan(b).any(0) | np.isnan(o).any(0))
    b, o = b[:, usable], o[:, usable]
    nb, no = len(b), len(o)
    point = float(np.mean(other_points) - np.mean(base_points))
    df = nb + no - 2 if seeds else 0
    seed_var = seed_bound = 0.0
    own: List = []
    if df > 0:
        scale = 1 / nb + 1 / no
        s2 = _pooled([np.asarray(base_points, np.float64), np.asarray(other_points, np.float64)])
        seed_var = s2 * scale
        seed_bound = df * seed_var / float(stats.chi2.ppf(1 - SEED_BOUND, df))
        # NOTE: each seed's own noise on these images is in the between-seed variance already
        own = [(len(x) / (len(x) - 1), x - x.mean(0)) for x in (b, o) if len(x) > 1]
    diff = o.mean(0) - b.mean(0)
    # rows: the difference, then every seed's deviation from its recipe's mean
    series = np.vstack([diff[None]] + [dev for _, dev in own])
    weights = [(len(dev) - 1) * k / len(dev) for k, dev in own for _ in dev]

    def images_var(variances: np.ndarray) -> np.ndarray:
        """V_images from the rows' replicate variances (``(rows,)`` or ``(rows, batches)``)."""
        v = variances[0]
        if own:
            v = v - scale * np.tensordot(weights, variances[1:], 1) / sum(
                len(dev) - 1 for _, dev in own)
        return np.maximum(v, 0.0)

    def p_of(v_images: np.ndarray) -> np.ndarray:
        total = np.asarray(v_images, np.float64) + seed_var
        with np.errstate(divide='ignore', invalid='ignore'):
            t = abs(point) / np.sqrt(total)
            ratio = np.full_like(total, np.inf) if seed_bound <= 0 else v_images / seed_bound
        p = null_sf(np.where(total > 0, t, 0.0), ratio, df)
        # NOTE: no variance at all: certain of a non-zero difference, no evidence of zero's
        return np.where(np.isnan(total), np.nan, np.where(total > 0, p, float(point == 0)))

    r_count = diff.size
    v = float(images_var(np.var(series, axis=1, ddof=1))) if r_count >= 2 else float('nan')
    p = float(p_of(v))
    p_se = float('nan')
    if r_count >= 10:
        # jackknife over batches of replicates: p's spread from the replicates drawn (each
        # left-out variance from sums, centred first for precision)
        k = min(_BATCHES, r_count // 5)
        starts = np.array_split(np.arange(r_count), k)
        centred = series - series.mean(1, keepdims=True)
        first = np.add.reduceat(centred, [c[0] for c in starts], axis=1)
        second = np.add.reduceat(centred ** 2, [c[0] for c in starts], axis=1)
        kept = r_count - np.array([len(c) for c in starts])
        s1 = centred.sum(1, keepdims=True) - first
        s2 = (centred ** 2).sum(1, keepdims=True) - second
        left_out = p_of(images_var((s2 - s1 ** 2 / kept) / (kept - 1)))
        p_se = float(math.sqrt((k - 1) / k * np.sum((left_out - left_out.mean()) ** 2)))
    r = math.inf if seed_bound <= 0 or v != v else v / seed_bound
    half = float('nan')
    if v == v and v + seed_var > 0:
        level = 1 - confidence
        normal = float(stats.norm.isf(level / 2))
        # NOTE: the quantile lies between the normal's (rho infinite) and Student's t's (rho 0)
        q = normal if math.isinf(r) else optimize.brentq(
            lambda t: null_sf(t, r, df) - level, normal * (1 - 1e-9),
            float(stats.t.isf(level / 2, df)) * (1 + 1e-9), rtol=1e-6)
        half = q * math.sqrt(v + seed_var)
    elif v == v:
        half = 0.0
    return {'difference': point, 'low': point - half, 'high': point + half, 'p': p,
            'p_se': p_se, 'seed_df': df, 'replicates': int(r_count)}


def holm_verdicts(rows: Mapping[str, Dict[str, float]], alpha: float) -> None:
    """Holm's correction over ``rows`` (each with ``difference``, ``p``, ``p_se``), in place.

    Adds ``p_holm``, ``significant`` (settled: significant at ``p + MC_Z p_se`` for every row),
    ``undecided`` (significant at ``p - MC_Z p_se`` but not at ``p + MC_Z p_se``) and
    ``verdict``: ``better`` / ``worse`` / ``not shown`` / ``undecided``, or ``no test`` where p is
    NaN (such a row is left out of the family).
    """
    tested = [k for k, r in rows.items() if r['p'] == r['p']]
    for k in rows:
        if k not in tested:
            rows[k].update(p_holm=float('nan'), significant=False, undecided=False,
                           verdict='no test')
    if not tested:
        return
    p = np.array([rows[k]['p'] for k in tested])
    # NOTE: an unknown Monte-Carlo error (too few replicates) leaves every decision open
    se = np.array([rows[k]['p_se'] for k in tested])
    se = np.where(np.isnan(se), np.inf, se)
    sure = np.array(holm(np.clip(p + MC_Z * se, 0, 1))) <= alpha
    maybe = np.array(holm(np.clip(p - MC_Z * se, 0, 1))) <= alpha
    for k, p_adj, yes, perhaps in zip(tested, holm(p), sure, maybe):
        row = rows[k]
        undecided = bool(perhaps and not yes)
        row.update(p_holm=p_adj, significant=bool(yes), undecided=undecided,
                   verdict='undecided' if undecided else
                   ('better' if row['difference'] > 0 else 'worse') if yes else 'not shown')
