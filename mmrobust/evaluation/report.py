"""Tables, CSV and plots of robustness results (mmrobust JSON or mmdet 3.3 ``*_results.pkl``)."""
import csv
import os
import os.path as osp
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..corruptions import BENCHMARK_CORRUPTIONS, CATEGORIES, CORRUPTIONS, Protocol
from ..datasets.shift_sets import is_shift_cell
from ..utils.io import save_figure
from .metrics import robustness_summary
from .results import corruption_cells, load_results
from .shift_report import plot_shifts, shift_markdown, write_shift_csv
from .worst_case import WORST

__all__ = ['Extras', 'build_extras', 'load_results', 'summarize', 'summary_markdown',
           'write_csv', 'plot']

# metrics shown by default, in this order, when present
MAIN_METRICS = ('bbox_mAP', 'segm_mAP', 'mIoU', 'AP', 'mAP')


def _protocol_of(results: Mapping) -> Optional[Protocol]:
    """The results' protocol: its planned corruption cells, grouped as the named protocol
    groups them."""
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
    return robustness_summary(results['cells'], _protocol_of(results))


# -- uncertainty: intervals, paired differences, seeds, CE -----------------------------------------

Interval = Tuple[float, float]


@dataclass
class Extras:
    """What the report adds to the recorded numbers (:mod:`.uncertainty`): bootstrap intervals
    per model (``intervals[label][metric][quantity]``, quantity P_clean / mPC / rPC, and
    ``cell_intervals[label][metric][(corruption, severity)]``), paired differences against the
    first group, mean and std across seeds per group, CE / mCE against a reference, and notes
    on what could not be computed and why."""
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
    #: what the paired intervals resample: 'images', or 'seeds, then images' (two-level)
    paired_kind: str = 'images'
    #: (recipe, minus, metric, corruption, {difference, low, high, p, p_holm, significant})
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
    """Intervals, paired differences, seed statistics and CE for ``entries`` (``(label, results
    path, results)``; ``groups`` maps a recipe to the labels of its seeds, in order, the first
    group being the baseline of the paired differences). ``boot`` (a
    :class:`~.uncertainty.Bootstrap`): None or 0 replicates for no intervals. ``baselines``:
    the recipes the effective-robustness trend is fitted on (``er_axis``); ``seed_bootstrap``:
    paired intervals resample the seeds too (two-level); ``alpha``: the family-wise level of
    the per-corruption differences (Holm)."""
    from .comparisons import recipe_corruption_differences
    from .uncertainty import (
        PairingError,
        check_pairable,
        corruption_error_replicates,
        corruption_errors,
        interval,
        paired_differences,
        seed_statistics,
    )
    extras = Extras(confidence=boot.confidence if boot else 0.95,
                    replicates=boot.replicates if boot else 0, alpha=alpha)
    if seed_bootstrap and any(len(labels) > 1 for labels in groups.values()):
        extras.paired_kind = 'seeds, then images'
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
                                   seed_draws=boot.seed if seed_bootstrap else None)
        for name, row in diffs.items():
            if name not in metrics:
                continue
            for q, (diff, lo, hi) in row.items():
                extras.paired.append((other, names[0], name, q, diff, lo, hi))
        for name in metrics:
            for corruption, row in recipe_corruption_differences(
                    [reps[lb] for lb in base_labels], [reps[lb] for lb in other_labels],
                    [points[lb] for lb in base_labels], [points[lb] for lb in other_labels],
                    name, boot.confidence, alpha).items():
                extras.per_corruption.append((other, names[0], name, corruption, row))
    if baselines:
        _effective(extras, groups, points, reps, metrics, baselines, er_axis, boot)
    # corruption error
    if reference is not None:
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
    return extras


def _effective(extras: Extras, groups: Mapping[str, Sequence[str]], points: Mapping[str, Dict],
               reps: Mapping[str, Dict], metrics: Sequence[str], baselines: Sequence[str],
               axis: str, boot: Optional[Any]) -> None:
    """Effective robustness of every recipe against the ``baselines``' trend (seeds averaged;
    an interval where every recipe involved has replicates)."""
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
    """Each model's bootstrap replicates and the intervals they give (into ``extras``, with
    notes on what could not be resampled); ``(statistics, replicates)`` per label."""
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
        missing = [n for n in points[label]['metrics'] if n in reps[label]
                   and 'mPC' not in reps[label][n]]
        if missing:
            extras.notes.append(f'{label}: no mPC / rPC interval (cells of the protocol '
                                'without per-image statistics)')
    return stats, reps


def entries_by(entries: Sequence[Tuple[str, str, Mapping]], label: str) -> Mapping:
    return next(results for lb, _, results in entries if lb == label)


def _with_interval(value: float, iv: Optional[Interval], scale: float = 1.0) -> str:
    text = _fmt(value, scale)
    if iv is None or iv[0] != iv[0]:
        return text
    return f'{text} [{_fmt(iv[0], scale)}, {_fmt(iv[1], scale)}]'


def _pct(value: float) -> str:
    return '—' if value != value else f'{100 * value:.1f}'


def _extras_markdown(extras: Extras) -> List[str]:
    lines: List[str] = []
    level = f'{extras.confidence:.0%}'
    if extras.intervals:
        lines += ['', f'[lo, hi]: {level} bootstrap percentile intervals over the test images '
                  f'({extras.replicates} replicates; one draw of images for every cell and '
                  'model).']
    if extras.paired:
        what = ('the same resampled images for both' if extras.paired_kind == 'images' else
                'two-level: each replicate draws every recipe\'s seeds, then the images')
        lines += ['', f'Paired differences ({what}; {level} interval, {extras.replicates} '
                  f'replicates; resampled: {extras.paired_kind}):', '',
                  '| model | minus | metric | quantity | difference | interval |',
                  '|---|---|---|---|---|---|']
        for other, base, name, q, diff, lo, hi in extras.paired:
            scale = 100 if q == 'rPC' else 1
            unit = ' pp' if q == 'rPC' else ''
            lines.append(f'| {other} | {base} | {name} | {q} | {_fmt(diff, scale)}{unit} | '
                         f'[{_fmt(lo, scale)}, {_fmt(hi, scale)}] |')
    lines += _per_corruption_markdown(extras)
    lines += _effective_markdown(extras)
    if extras.seeds:
        lines += ['', 'Across training seeds (mean ± sample standard deviation):', '',
                  '| recipe | metric | files | P_clean | mPC | rPC % |',
                  '|---|---|---|---|---|---|']
        for group, by_metric in extras.seeds.items():
            for name, row in by_metric.items():
                cells = [f'{_fmt(row[q][1], 100 if q == "rPC" else 1)} ± '
                         f'{_fmt(row[q][2], 100 if q == "rPC" else 1)}'
                         for q in ('P_clean', 'mPC', 'rPC')]
                lines.append(f'| {group} | {name} | {row["P_clean"][0]} | ' + ' | '.join(cells)
                             + ' |')
    if extras.errors:
        lines += ['', f'Corruption Error against {extras.reference} (ImageNet-C; %):', '',
                  '| model | metric | mCE | relative mCE | over |', '|---|---|---|---|---|']
        for label, by_metric in extras.errors.items():
            for name, ce in by_metric.items():
                shown = []
                for q in ('mCE', 'relative_mCE'):
                    iv = ce.get('intervals', {}).get(q)
                    shown.append(_pct(ce[q]) + (f' [{_pct(iv[0])}, {_pct(iv[1])}]'
                                                if iv and iv[0] == iv[0] else ''))
                lines.append(f'| {label} | {name} | {shown[0]} | {shown[1]} | '
                             f'{ce.get("corruptions", "")} |')
        if any('intervals' in ce for by in extras.errors.values() for ce in by.values()):
            lines.append(f'\nmCE intervals: {extras.confidence:.0%} over this run\'s test images '
                         f'({extras.replicates} replicates), the reference held at its numbers.')
    if extras.notes:
        lines += [''] + [f'- {note}' for note in extras.notes]
    return lines


def _per_corruption_markdown(extras: Extras) -> List[str]:
    """Per-corruption paired differences with Holm's correction, and the count they back."""
    lines: List[str] = []
    pairs = list(dict.fromkeys((o, b, n) for o, b, n, _, _ in extras.per_corruption))
    for other, base, name in pairs:
        rows = [(c, r) for o, b, n, c, r in extras.per_corruption
                if (o, b, n) == (other, base, name)]
        better = sum(r['significant'] and r['difference'] > 0 for _, r in rows)
        worse = sum(r['significant'] and r['difference'] < 0 for _, r in rows)
        lines += ['', f'{other} minus {base}, {name}, per corruption (mean over severities; '
                  f'{extras.confidence:.0%} interval, {extras.replicates} replicates, '
                  f'resampled: {extras.paired_kind}; p: bootstrap, Holm over the '
                  f'{len(rows)} corruptions):', '',
                  '| corruption | difference | interval | p | p (Holm) | '
                  f'at family-wise {extras.alpha:g} |', '|---|---|---|---|---|---|']
        for c, r in rows:
            verdict = ('better' if r['difference'] > 0 else 'worse') if r['significant'] \
                else 'not shown'
            lines.append(f"| {c} | {_fmt(r['difference'])} | [{_fmt(r['low'])}, "
                         f"{_fmt(r['high'])}] | {_p(r['p'], extras.replicates)} | "
                         f"{_p(r['p_holm'], extras.replicates)} | {verdict} |")
        lines.append(f'\n{other} is better than {base} on {better} and worse on {worse} of '
                     f'{len(rows)} corruptions at a family-wise error rate of {extras.alpha:g} '
                     '(Holm).')
    return lines


def _p(value: float, replicates: int) -> str:
    """A bootstrap p-value: below the resolution of the replicates it is shown as a bound."""
    if value == 0 and replicates:
        return f'< {1 / replicates:.1g}'
    return f'{value:.3g}'


def _effective_markdown(extras: Extras) -> List[str]:
    """Effective robustness against the baselines' trend."""
    lines: List[str] = []
    for name, er in extras.effective.items():
        lines += ['', f'Effective robustness, {name} (Taori et al. 2020): mPC minus the trend of '
                  f'mPC against P_clean fitted on {", ".join(er["baselines"])} in '
                  f'{er["axis"]} axes ({extras.confidence:.0%} interval, {extras.replicates} '
                  'replicates, the trend refitted on each):', '',
                  '| model | P_clean | mPC | trend at its P_clean | effective robustness |',
                  '|---|---|---|---|---|']
        for label, m in er['models'].items():
            shown = _fmt(m['ER']) + (f" [{_fmt(m['low'])}, {_fmt(m['high'])}]"
                                     if m['low'] == m['low'] else '')
            base = ' (baseline)' if label in er['baselines'] else ''
            lines.append(f"| {label}{base} | {_fmt(m['P_clean'])} | {_fmt(m['mPC'])} | "
                         f"{_fmt(m['trend'])} | {shown} |")
    return lines


def adversarial_curves(results: Mapping) -> Dict[str, Dict[str, List[Tuple[float, float]]]]:
    """``{metric: {attack: [(epsilon, value), ...]}}`` of a results file's attack cells, from
    epsilon 0 (the clean score) up; empty without attacks."""
    curves: Dict[str, Dict[str, List[Tuple[float, float]]]] = {}
    clean = results['cells'].get('clean', {})
    clean = clean.get(0, clean.get('0', {}))
    attacks = dict(results.get('attacks') or {})
    if attacks and WORST in results['cells']:  # NOTE: the worst case has the attacks' budgets
        attacks[WORST] = next(iter(attacks.values()))
    for attack, entry in attacks.items():
        by_index = results['cells'].get(attack, {})
        for k, eps in enumerate(entry['epsilons'], start=1):
            scores = by_index.get(k, by_index.get(str(k)))
            for metric, value in (scores or {}).items():
                points = curves.setdefault(metric, {}).setdefault(attack, [])
                if not points and metric in clean and eps > 0:
                    points.append((0.0, float(clean[metric])))
                points.append((float(eps), float(value)))
    return curves


def attack_setting(results: Mapping, attack: str) -> str:
    """How hard ``attack`` tried, to print next to its figures: ``10 steps, random start``
    (and the restarts when more than one); an attack's strength is only comparable with it."""
    if attack == WORST:
        return f'per image, worst of {", ".join(results.get("attacks") or {})}'
    settings = (results.get('attacks') or {}).get(attack, {}).get('settings', {})
    steps = settings.get('steps')
    if steps is None:
        return ''
    parts = [f'{steps} step{"s" if steps != 1 else ""}']
    if settings.get('random_start'):
        parts.append('random start')
    if settings.get('restarts', 1) > 1:
        parts.append(f'{settings["restarts"]} restarts')
    return ', '.join(parts)


def _adversarial_markdown(results_by_label: Mapping[str, Mapping], metrics: Sequence[str]
                          ) -> List[str]:
    lines: List[str] = []
    curves = {label: adversarial_curves(r) for label, r in results_by_label.items()}
    for name in metrics:
        rows = [(label, attack, eps, value) for label, by_metric in curves.items()
                for attack, points in by_metric.get(name, {}).items() for eps, value in points]
        if not rows:
            continue
        lines += ['', f'{name} under attack (epsilon in [0, 1] RGB pixel units; 0: clean):', '',
                  '| model | attack | epsilon | epsilon x 255 | value | setting |',
                  '|---|---|---|---|---|---|']
        lines += [f'| {label} | {attack} | {eps:.5g} | {eps * 255:.3g} | {_fmt(value)} | '
                  f'{attack_setting(results_by_label[label], attack)} |'
                  for label, attack, eps, value in rows]
    return lines


def main_metrics(summaries: Mapping[str, Dict]) -> List[str]:
    """The headline metrics present (box/mask AP, mIoU), else every metric."""
    names: List[str] = []
    for summary in summaries.values():
        names += [n for n in summary['metrics'] if n not in names]
    chosen = [n for key in MAIN_METRICS for n in names if n.split('/')[-1] == key]
    return chosen or names


def _fmt(value: float, scale: float = 1.0, unit: str = '') -> str:
    """A number for tables and legends; '—' for an undefined one (rPC when P_clean is 0)."""
    if value != value:
        return '—'
    return f'{value * scale:.1f}{unit}' if unit else f'{value * scale:.3f}'


def summary_markdown(results_by_label: Mapping[str, Mapping],
                     metrics: Optional[Sequence[str]] = None,
                     extras: Optional[Extras] = None) -> str:
    """Markdown: P_clean / mPC / rPC per model and metric (with their intervals), then the
    per-corruption means, attacks, paired differences, seeds and CE (:class:`Extras`)."""
    summaries = {label: summarize(r) for label, r in results_by_label.items()}
    metrics = list(metrics) if metrics else main_metrics(summaries)
    extras = extras or Extras()
    lines = ['| model | metric | P_clean | mPC | rPC % | cells |', '|---|---|---|---|---|---|']
    for label, summary in summaries.items():
        missing = len(summary['missing'])
        cells = f"{summary['cells']}" + (f' ({missing} missing)' if missing else '')
        for name in metrics:
            m = summary['metrics'].get(name)
            if m:
                iv = extras.intervals.get(label, {}).get(name, {})
                shown = [_with_interval(m[q], iv.get(q), 100 if q == 'rPC' else 1)
                         for q in ('P_clean', 'mPC', 'rPC')]
                lines.append(f"| {label} | {name} | {' | '.join(shown)} | {cells} |")
    for name in metrics:
        corruptions = list(dict.fromkeys(
            c for s in summaries.values() if name in s['metrics']
            for c in s['metrics'][name]['per_corruption']))
        if not corruptions:
            continue
        lines += ['', f'{name}, mean over severities:', '',
                  '| corruption | ' + ' | '.join(summaries) + ' |',
                  '|---|' + '---|' * len(summaries)]
        for c in corruptions:
            row = [_fmt(s['metrics'].get(name, {}).get('per_corruption', {}).get(c, float('nan')))
                   for s in summaries.values()]
            lines.append(f'| {c} | ' + ' | '.join(row) + ' |')
        for cat in CATEGORIES:
            values = [s['metrics'].get(name, {}).get('per_category', {}).get(cat, float('nan'))
                      for s in summaries.values()]
            if any(v == v for v in values):
                lines.append(f'| *{cat}* | ' + ' | '.join(_fmt(v) for v in values) + ' |')
    notes = [f'{label}: {r["aggregate"]}' for label, r in results_by_label.items()
             if r.get('aggregate')]
    if notes:
        lines += [''] + notes
    lines += _adversarial_markdown(results_by_label, metrics)
    lines += shift_markdown(results_by_label, metrics, extras)
    lines += _extras_markdown(extras)
    return '\n'.join(lines)


def write_csv(results_by_label: Mapping[str, Mapping], out_dir: str,
              extras: Optional[Extras] = None) -> Tuple[str, str]:
    """``cells.csv`` (every model, metric, corruption, severity) and ``summary.csv``, with
    their intervals (empty where there are none); ``paired.csv``, ``seeds.csv`` and
    ``corruption_error.csv`` when :class:`Extras` has them. Returns the first two paths."""
    os.makedirs(out_dir, exist_ok=True)
    extras = extras or Extras()
    cells_path, summary_path = osp.join(out_dir, 'cells.csv'), osp.join(out_dir, 'summary.csv')
    with open(cells_path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['model', 'corruption', 'category', 'severity', 'metric', 'value',
                         'ci_low', 'ci_high'])
        for label, results in results_by_label.items():
            for corruption, by_severity in results['cells'].items():
                category = CORRUPTIONS[corruption].category if corruption in CORRUPTIONS else (
                    'adversarial' if corruption in (results.get('attacks') or {}) else
                    'real-world shift' if is_shift_cell(corruption) else '')
                for severity, scores in sorted(by_severity.items(), key=lambda kv: int(kv[0])):
                    for metric, value in scores.items():
                        iv = extras.cell_intervals.get(label, {}).get(metric, {}).get(
                            (corruption, int(severity)), ('', ''))
                        writer.writerow([label, corruption, category, severity, metric, value,
                                         *iv])
    with open(summary_path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['model', 'metric', 'P_clean', 'mPC', 'rPC', 'cells', 'missing',
                         'P_clean_low', 'P_clean_high', 'mPC_low', 'mPC_high', 'rPC_low',
                         'rPC_high', 'confidence', 'replicates'])
        for label, results in results_by_label.items():
            summary = summarize(results)
            for metric, m in summary['metrics'].items():
                iv = extras.intervals.get(label, {}).get(metric, {})
                bounds = [b for q in ('P_clean', 'mPC', 'rPC') for b in iv.get(q, ('', ''))]
                writer.writerow([label, metric, m['P_clean'], m['mPC'], m['rPC'],
                                 summary['cells'], len(summary['missing']), *bounds,
                                 extras.confidence if iv else '',
                                 extras.replicates if iv else ''])
    if extras.paired:
        _rows_csv(osp.join(out_dir, 'paired.csv'),
                  ['model', 'minus', 'metric', 'quantity', 'difference', 'ci_low', 'ci_high',
                   'confidence', 'replicates'],
                  [[*row, extras.confidence, extras.replicates] for row in extras.paired])
    if extras.seeds:
        _rows_csv(osp.join(out_dir, 'seeds.csv'),
                  ['recipe', 'metric', 'quantity', 'files', 'mean', 'std'],
                  [[group, name, q, n, mean, std] for group, by_metric in extras.seeds.items()
                   for name, row in by_metric.items() for q, (n, mean, std) in row.items()])
    if extras.errors:
        rows = []
        for label, by_metric in extras.errors.items():
            for name, ce in by_metric.items():
                rows += [[label, extras.reference, name, c, v['CE'], v['relative_CE']]
                         for c, v in ce['per_corruption'].items()]
                rows.append([label, extras.reference, name,
                             f'mean (mCE over {ce.get("corruptions", "the corruptions above")})',
                             ce['mCE'], ce['relative_mCE']])
        _rows_csv(osp.join(out_dir, 'corruption_error.csv'),
                  ['model', 'reference', 'metric', 'corruption', 'CE', 'relative_CE'], rows)
    curves = {label: adversarial_curves(r) for label, r in results_by_label.items()}
    if any(curves.values()):
        with open(osp.join(out_dir, 'attacks.csv'), 'w', newline='') as f:
            writer = csv.writer(f)
            writer.writerow(['model', 'attack', 'epsilon', 'metric', 'value', 'setting'])
            for label, by_metric in curves.items():
                for metric, by_attack in by_metric.items():
                    for attack, points in by_attack.items():
                        setting = attack_setting(results_by_label[label], attack)
                        for eps, value in points:
                            writer.writerow([label, attack, eps, metric, value, setting])
    names = main_metrics({label: summarize(r) for label, r in results_by_label.items()})
    write_shift_csv(results_by_label, out_dir, names, extras)
    return cells_path, summary_path


def _rows_csv(path: str, header: Sequence[str], rows: Sequence[Sequence]) -> None:
    with open(path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def plot(results_by_label: Mapping[str, Mapping], out_dir: str,
         metrics: Optional[Sequence[str]] = None, extras: Optional[Extras] = None) -> List[str]:
    """Per-corruption bars and per-severity curves, models side by side, and P_clean / mPC /
    rPC with their intervals where :class:`Extras` has them; returns the PNGs."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import numpy as np

    os.makedirs(out_dir, exist_ok=True)
    summaries = {label: summarize(r) for label, r in results_by_label.items()}
    metrics = list(metrics) if metrics else main_metrics(summaries)
    written = []
    for name in metrics:
        safe = name.replace('/', '_')
        corruptions = list(dict.fromkeys(
            c for s in summaries.values() if name in s['metrics']
            for c in s['metrics'][name]['per_corruption']))
        fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(corruptions) + 2), 4))
        width = 0.8 / max(len(summaries), 1)
        xs = np.arange(len(corruptions))
        for i, (label, s) in enumerate(summaries.items()):
            m = s['metrics'].get(name)
            if not m:
                continue
            values = [m['per_corruption'].get(c, np.nan) for c in corruptions]
            ax.bar(xs + (i - (len(summaries) - 1) / 2) * width, values, width,
                   label=f"{label} (mPC {_fmt(m['mPC'])}, rPC {_fmt(m['rPC'], 100, '%')})")
            ax.axhline(m['P_clean'], color=f'C{i}', linestyle='--', linewidth=1)
        ax.set_xticks(xs, corruptions, rotation=45, ha='right')
        written.append(_finish(fig, ax, f'{name} (mean over severities)',
                               f'{name} per corruption (dashed: clean)',
                               osp.join(out_dir, f'per_corruption_{safe}.png')))

        fig, ax = plt.subplots(figsize=(5.5, 4))
        for i, (label, s) in enumerate(summaries.items()):
            m = s['metrics'].get(name)
            if not m:
                continue
            severities = [0] + list(m['per_severity'])
            values = [m['P_clean']] + list(m['per_severity'].values())
            ax.plot(severities, values, marker='o', color=f'C{i}', label=label)
        ax.set_xlabel('severity (0 = clean)')
        written.append(_finish(fig, ax, f'{name} (mean over corruptions)',
                               f'{name} per severity',
                               osp.join(out_dir, f'per_severity_{safe}.png')))

        written += plot_shifts(results_by_label, out_dir, [name], extras)
        if extras is not None and name in extras.effective:
            written.append(_effective_plot(extras.effective[name], name, extras,
                                           osp.join(out_dir, f'effective_robustness_{safe}.png')))
        if extras is not None and any(name in by for by in extras.intervals.values()):
            written.append(_interval_plot(summaries, extras, name,
                                          osp.join(out_dir, f'intervals_{safe}.png')))

        curves = {label: adversarial_curves(r).get(name, {})
                  for label, r in results_by_label.items()}
        if any(curves.values()):
            fig, ax = plt.subplots(figsize=(5.5, 4))
            for i, (label, by_attack) in enumerate(curves.items()):
                for j, (attack, points) in enumerate(by_attack.items()):
                    ax.plot([e * 255 for e, _ in points], [v for _, v in points], marker='o',
                            color=f'C{i}', linestyle=('-', '--', ':', '-.')[j % 4],
                            label=f'{label} {attack} '
                                  f'({attack_setting(results_by_label[label], attack)})')
            ax.set_xlabel('epsilon x 255 (0 = clean)')
            written.append(_finish(fig, ax, name, f'{name} under attack',
                                   osp.join(out_dir, f'adversarial_{safe}.png')))
    return written


def _interval_plot(summaries: Mapping[str, Dict], extras: Extras, name: str, path: str) -> str:
    """P_clean and mPC (left) and rPC (right) per model, with their bootstrap intervals."""
    import matplotlib.pyplot as plt
    import numpy as np
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(6, 1.2 * len(summaries) + 3), 4))
    xs = np.arange(len(summaries))
    for ax, quantities in ((left, ('P_clean', 'mPC')), (right, ('rPC', ))):
        for j, q in enumerate(quantities):
            scale = 100 if q == 'rPC' else 1
            values, errs = [], [[], []]
            for label, s in summaries.items():
                v = s['metrics'].get(name, {}).get(q, float('nan')) * scale
                lo, hi = extras.intervals.get(label, {}).get(name, {}).get(
                    q, (float('nan'), float('nan')))
                values.append(v)
                errs[0].append(max(v - lo * scale, 0) if lo == lo else 0)
                errs[1].append(max(hi * scale - v, 0) if hi == hi else 0)
            ax.errorbar(xs + 0.1 * j, values, yerr=errs, fmt='o', capsize=4, label=q)
        ax.set_xticks(xs, list(summaries), rotation=30, ha='right')
        ax.set_ylabel('rPC %' if quantities == ('rPC', ) else name)
        ax.legend(fontsize=8)
    fig.suptitle(f'{name}: {extras.confidence:.0%} bootstrap intervals '
                 f'({extras.replicates} replicates)')
    fig.tight_layout()
    return save_figure(fig, path)


def _effective_plot(er: Mapping[str, Any], name: str, extras: Extras, path: str) -> str:
    """mPC against P_clean: every model (intervals of its effective robustness as error bars
    around its mPC), the baselines' trend, each model's distance above it."""
    import matplotlib.pyplot as plt
    import numpy as np

    from .comparisons import _trend
    from .uncertainty import metric_scale
    scale = metric_scale(name)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    models = er['models']
    xs = np.array([m['P_clean'] for m in models.values()])
    span = np.linspace(max(xs.min() - 0.1 * scale, 1e-3 * scale),
                       min(xs.max() + 0.1 * scale, scale * (1 - 1e-3)), 100)
    ax.plot(span, _trend(er['slope'], er['intercept'], span / scale, er['axis']) * scale, 'k--',
            linewidth=1, label=f'trend of the baselines ({er["axis"]} fit)')
    for i, (label, m) in enumerate(models.items()):
        err = None
        if m['low'] == m['low']:
            err = [[max(m['ER'] - m['low'], 0)], [max(m['high'] - m['ER'], 0)]]
        marker = 's' if label in er['baselines'] else 'o'
        ax.errorbar([m['P_clean']], [m['mPC']], yerr=err, fmt=marker, color=f'C{i}',
                    capsize=4, label=f"{label}: ER {_fmt(m['ER'])}")
        ax.plot([m['P_clean'], m['P_clean']], [m['trend'], m['mPC']], color=f'C{i}',
                linewidth=0.8)
    ax.set_xlabel(f'{name} P_clean')
    title = (f'effective robustness ({extras.confidence:.0%} intervals, '
             f'{extras.replicates} replicates)' if extras.replicates else
             'effective robustness')
    return _finish(fig, ax, f'{name} mPC', title, path)


def _finish(fig, ax, ylabel: str, title: str, path: str) -> str:
    """Label, lay out, save and close a figure; returns its path."""
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
