"""The computation behind the robustness report.

Each results file's summary (P_clean, mPC, rPC, per corruption, category and severity), and the
statistics the report adds to it (:class:`Extras`: bootstrap intervals, paired and per-corruption
differences, seeds, CE / mCE, effective robustness), computed once; :mod:`.report` renders them
(Markdown, CSV, plots).
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..corruptions import BENCHMARK_CORRUPTIONS, Protocol
from ..datasets.shift_sets import SHIFT_MEANS
from .metrics import MAIN_METRICS, robustness_summary
from .results import corruption_cells

__all__ = ['Extras', 'Interval', 'MAIN_METRICS', 'build_extras', 'entries_by', 'main_metrics',
           'summarize']


def _protocol_of(results: Mapping) -> Optional[Protocol]:
    """The results' protocol: its planned corruption cells.

    Grouped as the named protocol groups them.
    """
    from ..corruptions import PROTOCOLS
    if not results.get('cells_planned'):
        return None
    severities: Dict[str, Tuple[int, ...]] = {}
    for corruption, severity in corruption_cells(results):
        severities[corruption] = severities.get(corruption, ()) + (severity,)
    name = results.get('protocol', 'custom')
    known = PROTOCOLS.get(str(name).split(':')[0])
    return Protocol(name, '', severities, dict(known.categories) if known else {})


def summarize(results: Mapping) -> Dict:
    """P_clean, mPC and rPC of a results dict under its protocol."""
    return robustness_summary(results['cells'], _protocol_of(results))


# -- uncertainty: intervals, paired differences, seeds, CE -----------------------------------------

Interval = Tuple[float, float]


@dataclass
class Extras:
    """What the report adds to the recorded numbers (:mod:`.uncertainty`).

    Bootstrap intervals per model (``intervals[label][metric][quantity]``, quantity P_clean / mPC /
    rPC, and ``cell_intervals[label][metric][(corruption, severity)]``), paired differences against
    the first group, mean and std across seeds per group, CE / mCE against a reference, and notes on
    what could not be computed and why.
    """
    confidence: float = 0.95
    replicates: int = 0
    intervals: Dict[str, Dict[str, Dict[str, Interval]]] = field(default_factory=dict)
    cell_intervals: Dict[str, Dict[str, Dict[Tuple[str, int], Interval]]] = field(
        default_factory=dict)
    paired: List[Tuple[str, str, str, str, float, float, float]] = field(default_factory=list)
    seeds: Dict[str, Dict[str, Dict[str, Tuple[int, float, float]]]] = field(
        default_factory=dict)
    reference: Optional[str] = None
    errors: Dict[str, Dict[str, Dict[str, Any]]] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    #: what varies in the paired intervals: 'images', or 'seeds and images'
    paired_kind: str = 'images'
    #: (recipe, minus, metric, corruption, row of :func:`~.comparisons.per_corruption_differences`)
    per_corruption: List[Tuple[str, str, str, str, Dict[str, Any]]] = field(
        default_factory=list)
    alpha: float = 0.05
    #: metric -> :func:`~.comparisons.effective_robustness`'s result
    effective: Dict[str, Dict[str, Any]] = field(default_factory=dict)


def build_extras(entries: Sequence[Tuple[str, str, Mapping]], groups: Mapping[str, Sequence[str]],
                 boot: Optional[Any] = None, reference: Optional[Tuple[str, Mapping]] = None,
                 metrics: Optional[Sequence[str]] = None, baselines: Sequence[str] = (),
                 er_axis: str = 'logit', seed_bootstrap: bool = False,
                 alpha: float = 0.05) -> Extras:
    """The report's statistics for ``entries``.

    Intervals, paired differences, seed statistics and CE for ``entries`` (``(label, results path,
    results)``; ``groups`` maps a recipe to the labels of its seeds, in order, the first group being
    the baseline of the paired differences). ``boot`` (a :class:`~.uncertainty.Bootstrap`): None or
    0 replicates for no intervals. ``baselines``: the recipes the effective-robustness trend is
    fitted on (``er_axis``); ``seed_bootstrap``: the seeds vary in the paired intervals and the
    per-corruption tests (:mod:`.significance`; needs a recipe with two seeds or more);
    ``alpha``: the family-wise level of the per-corruption differences (Holm).
    """
    from .comparisons import CorruptionTests, run_corruption_tests
    from .uncertainty import (
        PairingError,
        check_pairable,
        paired_differences,
        seed_statistics,
    )
    extras = Extras(confidence=boot.confidence if boot else 0.95,
                    replicates=boot.replicates if boot else 0, alpha=alpha)
    if seed_bootstrap and any(len(labels) > 1 for labels in groups.values()):
        extras.paired_kind = 'seeds and images'
    elif seed_bootstrap:
        extras.notes.append('--seed-bootstrap: every recipe has one seed, so the seeds\' variance '
                            'cannot be estimated; the tests are about these checkpoints on these '
                            'images (seeds: give each recipe two or more results files)')
    points = {label: summarize(results) for label, _, results in entries}
    metrics = list(metrics) if metrics else main_metrics(points)
    stats, reps = _bootstrap_intervals(extras, entries, boot, points)
    # seeds
    for group, labels in groups.items():
        if len(labels) > 1:
            extras.seeds[group] = {name: row for name, row in seed_statistics(
                [points[lb] for lb in labels]).items() if name in metrics}
    # paired differences, every group against the first one
    names = list(groups)
    tests: List[CorruptionTests] = []
    for other in names[1:]:
        base_labels, other_labels = list(groups[names[0]]), list(groups[other])
        if not all(lb in reps and reps[lb] for lb in base_labels + other_labels):
            if reps:
                extras.notes.append(f'no paired difference {other} - {names[0]}: a results '
                                    'file has no per-image statistics')
            continue
        try:
            first = (base_labels[0], dict(entries_by(entries, base_labels[0])),
                     stats[base_labels[0]])
            for lb in base_labels[1:] + other_labels:
                check_pairable(first, (lb, dict(entries_by(entries, lb)), stats[lb]))
        except PairingError as err:
            extras.notes.append(f'paired difference {other} - {names[0]} refused: {err}')
            continue
        diffs = paired_differences([reps[lb] for lb in base_labels],
                                   [reps[lb] for lb in other_labels],
                                   [points[lb] for lb in base_labels],
                                   [points[lb] for lb in other_labels], boot.confidence,
                                   seeds=seed_bootstrap)
        for name, row in diffs.items():
            if name not in metrics:
                continue
            for q, (diff, lo, hi) in row.items():
                extras.paired.append((other, names[0], name, q, diff, lo, hi))
        tests += [CorruptionTests(other, names[0], name, other_labels, base_labels)
                  for name in metrics]
    if tests:
        extras.notes += run_corruption_tests(tests, reps, points, stats, boot, alpha,
                                             seed_bootstrap)
        extras.per_corruption = [(t.other, t.base, t.name, c, row) for t in tests
                                 for c, row in t.rows.items()]
    if baselines:
        _effective(extras, groups, points, reps, metrics, baselines, er_axis, boot)
    if reference is not None:
        _corruption_errors(extras, entries, reference, points, reps, metrics)
    return extras


def _corruption_errors(extras: Extras, entries: Sequence[Tuple[str, str, Mapping]],
                       reference: Tuple[str, Mapping], points: Mapping[str, Dict],
                       reps: Mapping[str, Dict], metrics: Sequence[str]) -> None:
    """Each entry's CE against ``reference`` ``(label, results)``, with this run's intervals."""
    from .uncertainty import corruption_error_replicates, corruption_errors, interval
    ref_label, ref_results = reference
    extras.reference = ref_label
    for label, _, results in entries:
        for name in points[label]['metrics']:
            if name not in metrics:
                continue
            done = list(points[label]['metrics'][name]['per_corruption'])
            # NOTE: ImageNet-C's mCE is over its 15 benchmark corruptions, whatever else ran
            chosen = [c for c in done if c in BENCHMARK_CORRUPTIONS] or done
            try:
                ce = corruption_errors(results['cells'], ref_results['cells'], name, chosen)
            except ValueError as err:
                extras.notes.append(f'no CE for {label} {name}: {err}')
                continue
            ce['corruptions'] = (
                f'the {len(chosen)} benchmark corruptions' if len(chosen) == 15 else
                f'{len(chosen)} of the 15 benchmark corruptions' if chosen != done or all(
                    c in BENCHMARK_CORRUPTIONS for c in done) else
                f'{len(chosen)} corruptions (none of the 15 benchmark ones)')
            replicated = reps.get(label, {}).get(name)
            if replicated:  # NOTE: this run's resampling; the reference held fixed
                per_rep = corruption_error_replicates(
                    replicated['cells'], results['cells'], ref_results['cells'], name,
                    chosen)
                if per_rep is not None:
                    ce['intervals'] = {q: interval(v, extras.confidence)
                                       for q, v in per_rep.items()}
            extras.errors.setdefault(label, {})[name] = ce
            extras.notes += [f'{label} {name}: {w}' for w in ce.get('warnings', [])]


def _effective(extras: Extras, groups: Mapping[str, Sequence[str]], points: Mapping[str, Dict],
               reps: Mapping[str, Dict], metrics: Sequence[str], baselines: Sequence[str],
               axis: str, boot: Optional[Any]) -> None:
    """Effective robustness of every recipe against the ``baselines``' trend.

    Seeds averaged; an interval where every recipe involved has replicates.
    """
    import numpy as np

    from .comparisons import effective_robustness
    from .uncertainty import metric_scale
    unknown = [b for b in baselines if b not in groups]
    if unknown:
        from ..utils.errors import UsageError
        raise UsageError(f'--baselines names {unknown}, which are not among the models '
                         f'({", ".join(groups)})')
    for name in metrics:
        pts, rep = {}, {}
        for group, labels in groups.items():
            rows = [points[lb]['metrics'].get(name) for lb in labels]
            if any(r is None or r['mPC'] != r['mPC'] for r in rows):
                continue
            pts[group] = (float(np.mean([r['P_clean'] for r in rows])),
                          float(np.mean([r['mPC'] for r in rows])))
            per = [reps.get(lb, {}).get(name) for lb in labels]
            if all(p and 'P_clean' in p and 'mPC' in p for p in per):
                rep[group] = (np.mean([p['P_clean'] for p in per], axis=0),
                              np.mean([p['mPC'] for p in per], axis=0))
        if sum(b in pts for b in baselines) < 2:
            extras.notes.append(f'no effective robustness for {name}: fewer than 2 baselines '
                                'with P_clean and mPC')
            continue
        extras.effective[name] = effective_robustness(
            pts, [b for b in baselines if b in pts], metric_scale(name), axis, rep or None,
            extras.confidence)


def _bootstrap_intervals(extras: Extras, entries: Sequence[Tuple[str, str, Mapping]],
                         boot: Optional[Any], points: Mapping[str, Dict]
                         ) -> Tuple[Dict[str, Any], Dict[str, Dict]]:
    """Each model's bootstrap replicates and the intervals they give.

    Into ``extras``, with notes on what could not be resampled. ``(statistics, replicates)`` per
    label.
    """
    from .uncertainty import interval, replicates_of
    reps: Dict[str, Dict] = {}
    stats: Dict[str, Any] = {}
    if boot is None or boot.replicates <= 0:
        return stats, reps
    for label, path, results in entries:
        if results.get('protocol') == 'mmdet-results':
            extras.notes.append(f'no intervals for {label}: mmdet\'s results file keeps no '
                                'per-image statistics (evaluate with '
                                'tools/test_robustness.py)')
            continue
        stats[label], reps[label] = replicates_of(path, results, boot)
        for note in stats[label].notes:
            extras.notes.append(f'{label}: {note}')
        if not reps[label]:
            extras.notes.append(f'no intervals for {label}: no per-image statistics')
            continue
        for name, entry in reps[label].items():
            extras.intervals.setdefault(label, {})[name] = {
                q: interval(entry[q], boot.confidence) for q in ('P_clean', 'mPC', 'rPC')
                if q in entry}
            extras.cell_intervals.setdefault(label, {})[name] = {
                cell: interval(v, boot.confidence) for cell, v in entry['cells'].items()}
            # NOTE: each shift set is resampled alone, so the mean of its sets' replicates is a
            # replicate of the mean over sets (a stratified bootstrap)
            for mean, (_, cells) in SHIFT_MEANS.items():
                if all(c in entry['cells'] for c in cells):
                    extras.cell_intervals[label][name][(mean, 0)] = interval(
                        np.mean([entry['cells'][c] for c in cells], axis=0), boot.confidence)
        missing = [n for n in points[label]['metrics'] if n in reps[label]
                   and 'mPC' not in reps[label][n]]
        if missing:
            extras.notes.append(f'{label}: no mPC / rPC interval (cells of the protocol '
                                'without per-image statistics)')
    return stats, reps


def entries_by(entries: Sequence[Tuple[str, str, Mapping]], label: str) -> Mapping:
    """The results of the entry labelled ``label``."""
    return next(results for lb, _, results in entries if lb == label)



def main_metrics(summaries: Mapping[str, Dict]) -> List[str]:
    """The headline metrics present (:data:`~.metrics.MAIN_METRICS`), else every metric."""
    names: List[str] = []
    for summary in summaries.values():
        names += [n for n in summary['metrics'] if n not in names]
    chosen = [n for key in MAIN_METRICS for n in names if n.split('/')[-1] == key]
    return chosen or names
