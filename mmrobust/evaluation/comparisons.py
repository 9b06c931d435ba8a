"""Comparisons a robustness reviewer asks for, on top of the bootstrap of :mod:`.uncertainty`.

- **Effective robustness** (Taori et al. 2020): rPC rewards a low clean score, so a model is
  compared with the trend of the baselines instead: a line fitted through the baselines'
  (P_clean, mPC) points, in the logit axes of Taori et al. (``logit``: logit(mPC) = a *
  logit(P_clean) + b, scores as fractions of the metric's scale) or in plain ones
  (``linear``). A model's effective robustness is its mPC minus the trend's mPC at its
  P_clean, in the metric's units. Its interval refits the line on every replicate (the same
  image draws for every model), so the baselines' noise is in it.
- **Per-corruption differences**: for each corruption, the difference of two recipes' means
  over severities, its interval, p with its Monte-Carlo error and Holm's step-down correction
  over the corruptions, so that "better on 12 of 15 corruptions" holds at the family-wise level
  stated, about the recipes when their seeds vary in the test, about these checkpoints
  otherwise (:mod:`.significance`).
"""
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..utils.errors import UsageError
from .significance import difference_test, holm_verdicts
from .uncertainty import bootstrap_weights, interval

__all__ = ['ER_AXES', 'TEST_BUDGET', 'TEST_ROUNDS', 'CorruptionTests', 'effective_robustness',
           'per_corruption_differences', 'recipe_corruption_differences',
           'run_corruption_tests', 'trend_at']

Cell = Tuple[str, int]

ER_AXES = ('logit', 'linear')
_EPS = 1e-6


def per_corruption_differences(base: Sequence[Mapping[Cell, np.ndarray]],
                               other: Sequence[Mapping[Cell, np.ndarray]],
                               base_points: Sequence[Mapping[str, float]],
                               other_points: Sequence[Mapping[str, float]], confidence: float,
                               alpha: float = 0.05, seeds: bool = False
                               ) -> Dict[str, Dict[str, Any]]:
    """``{corruption: row}`` of other minus base (:func:`~.significance.difference_test`).

    Each row: ``difference, low, high, p, p_se, seed_df`` and Holm's ``p_holm, significant,
    undecided, verdict`` over the corruptions (:func:`~.significance.holm_verdicts`).

    Args:
        base: one ``{(corruption, severity): (R,)}`` per seed of the base recipe: cell replicates
            of one metric on image draws shared with ``other``.
        other: the same of the recipe compared with ``base``.
        base_points: per seed, each corruption's recorded mean over severities.
        other_points: the same of ``other``.
        confidence: the level of the intervals (e.g. 0.95).
        alpha: the family-wise level of the verdicts.
        seeds: the seeds vary in the tests (between-seed variance); otherwise they are averaged.
    """
    everyone = list(base) + list(other)
    points = list(base_points) + list(other_points)
    corruptions = [c for c in dict.fromkeys(c for c, _ in base[0])
                   if all(c in p for p in points)]
    rows: Dict[str, Dict[str, Any]] = {}
    for c in corruptions:
        severities = sorted(s for c2, s in base[0] if c2 == c
                            and all((c, s) in cells for cells in everyone))
        if not severities:
            continue

        def mean(cells: Mapping[Cell, np.ndarray]) -> np.ndarray:
            return np.mean([cells[(c, s)] for s in severities], axis=0)
        rows[c] = difference_test([mean(x) for x in base], [mean(x) for x in other],
                                  [p[c] for p in base_points], [p[c] for p in other_points],
                                  confidence, seeds)
    holm_verdicts(rows, alpha)
    return rows


def recipe_corruption_differences(base: Sequence[Mapping], other: Sequence[Mapping],
                                  base_points: Sequence[Mapping], other_points: Sequence[Mapping],
                                  name: str, confidence: float, alpha: float, seeds: bool = False
                                  ) -> Dict[str, Dict[str, Any]]:
    """:func:`per_corruption_differences` of two recipes for metric ``name``.

    ``base`` / ``other``: each recipe's seeds' replicate summaries; ``base_points`` /
    ``other_points``: their point summaries. Empty where a seed lacks the metric's cell replicates.
    """
    if not all(name in r and r[name].get('cells') for r in list(base) + list(other)):
        return {}

    def per_corruption(summary: Mapping) -> Mapping[str, float]:
        return summary['metrics'].get(name, {}).get('per_corruption', {})
    return per_corruption_differences([r[name]['cells'] for r in base],
                                      [r[name]['cells'] for r in other],
                                      [per_corruption(p) for p in base_points],
                                      [per_corruption(p) for p in other_points],
                                      confidence, alpha, seeds)


#: extra replicates undecided tests may draw, as a share of the replicates the intervals drew
TEST_BUDGET = 0.4
#: rounds of extra replicates for undecided tests, in multiples of the report's replicates (each
#: at most what the budget has left)
TEST_ROUNDS = (3, 12)


@dataclass
class CorruptionTests:
    """The per-corruption tests of one pair of recipes and one metric (their seeds' labels)."""

    other: str
    base: str
    name: str
    other_labels: List[str]
    base_labels: List[str]
    rows: Dict[str, Dict[str, Any]] = field(default_factory=dict)


def run_corruption_tests(tests: Sequence[CorruptionTests], reps: Mapping[str, Mapping],
                         points: Mapping[str, Mapping], stats: Mapping[str, Any], boot: Any,
                         alpha: float, seeds: bool) -> List[str]:
    """Each test's rows, drawing more replicates where a Holm decision is undecided.

    An undecided corruption's cells get ``TEST_ROUNDS`` times the report's replicates more, in
    rounds (the same new image draws for every model), while the extra cell replicates stay within
    ``TEST_BUDGET`` of those the intervals drew (a round is cut to what is left of it). Returns
    notes for the report (what was drawn, what stays undecided).

    Args:
        tests: filled in place (``rows``).
        reps: each label's replicate summary (:func:`~.uncertainty.replicates_of`).
        points: each label's point summary.
        stats: each label's :class:`~.uncertainty.CellStats` (the paired ones share images).
        boot: the report's :class:`~.uncertainty.Bootstrap`.
        alpha: the family-wise level.
        seeds: the seeds vary in the tests.
    """
    grown: Dict[str, Dict[str, Dict[Cell, List[np.ndarray]]]] = {}

    def summary(label: str, name: str) -> Dict[str, Dict[str, Any]]:
        cells = dict(reps[label][name]['cells'])
        for cell, parts in grown.get(label, {}).get(name, {}).items():
            cells[cell] = np.concatenate([cells[cell], *parts])
        return {name: {'cells': cells}}

    def run(test: CorruptionTests) -> None:
        test.rows = recipe_corruption_differences(
            [summary(lb, test.name) for lb in test.base_labels],
            [summary(lb, test.name) for lb in test.other_labels],
            [points[lb] for lb in test.base_labels], [points[lb] for lb in test.other_labels],
            test.name, boot.confidence, alpha, seeds)
    for test in tests:
        run(test)
    budget = TEST_BUDGET * boot.replicates * sum(len(stats[lb].cells) for lb in reps)
    spent, notes = 0, []
    for round_, factor in enumerate(TEST_ROUNDS):
        open_tests = [t for t in tests if any(r['undecided'] for r in t.rows.values())]
        if not open_tests:
            break
        wanted: Dict[str, set] = {}
        for t in open_tests:
            corruptions = {c for c, r in t.rows.items() if r['undecided']}
            for lb in t.base_labels + t.other_labels:
                wanted.setdefault(lb, set()).update(c for c in stats[lb].cells
                                                    if c[0] in corruptions)
        n_cells = sum(len(c) for c in wanted.values())
        # NOTE: the last round draws what the budget has left, when that is at least one more R
        more = min(factor * boot.replicates, int(budget - spent) // n_cells)
        if more < boot.replicates:
            break
        spent += more * n_cells
        seed = zlib.crc32(f'{boot.seed} undecided tests {round_}'.encode())
        for lb, cells in wanted.items():
            weights = bootstrap_weights(len(stats[lb].images), more, seed)
            for cell in sorted(cells):
                for name, values in stats[lb].scores(cell, weights).items():
                    grown.setdefault(lb, {}).setdefault(name, {}).setdefault(cell, []).append(
                        values)
        for t in open_tests:
            run(t)
    if spent:
        most = max(r['replicates'] for t in tests for r in t.rows.values())
        notes.append(f'undecided per-corruption tests drew {spent} more cell replicates (their '
                     f'cells {most} replicates at most, the others {boot.replicates})')
    left = sum(r['undecided'] for t in tests for r in t.rows.values())
    if left:
        notes.append(f'{left} per-corruption decision(s) still undecided: settling them would '
                     f'draw more than {TEST_BUDGET:.0%} of the intervals\' replicates again; '
                     'rerun with a larger --bootstrap')
    return notes


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
