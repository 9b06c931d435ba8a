"""Tables, CSV and plots of robustness results (mmrobust JSON or mmdet 3.3 ``*_results.pkl``).

The rendering of what :mod:`.report_stats` computes. :func:`write_report` is what both tools call:
the summaries computed once, the Markdown returned, the CSV files written atomically, the plots
saved.
"""
import csv
import os
import os.path as osp
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..corruptions import PROTOCOL_CATEGORIES
from ..utils.io import atomic_write, save_figure
from .attack_report import adversarial_curves, attack_setting
from .cell_kinds import CELL_KINDS, UnknownCellError, kind_of
from .report_stats import Extras, Interval, build_extras, main_metrics, summarize
from .results import load_results
from .significance import MC_Z, SEED_BOUND

__all__ = ['Extras', 'build_extras', 'load_results', 'summarize', 'summary_markdown',
           'write_csv', 'plot', 'write_report', 'adversarial_curves', 'attack_setting',
           'main_metrics']

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
        what = ('the same resampled images for both; seeds averaged'
                if extras.paired_kind == 'images' else
                f'the between-seed variance at its {SEED_BOUND:.0%} upper bound and the '
                'bootstrap over the images')
        lines += ['', f'Paired differences ({what}; {level} interval, {extras.replicates} '
                  f'replicates; varies: {extras.paired_kind}):', '',
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
    """Per-corruption differences with Holm's correction, and the count they back."""
    lines: List[str] = []
    pairs = list(dict.fromkeys((o, b, n) for o, b, n, _, _ in extras.per_corruption))
    for other, base, name in pairs:
        rows = [(c, r) for o, b, n, c, r in extras.per_corruption
                if (o, b, n) == (other, base, name)]
        count = {v: sum(r['verdict'] == v for _, r in rows)
                 for v in ('better', 'worse', 'undecided')}
        df = rows[0][1]['seed_df']
        varies = (f'seeds and images: the between-seed variance ({df} df, at its '
                  f'{SEED_BOUND:.0%} upper bound) and the bootstrap over the images'
                  if df else 'images (seeds averaged; seed variance not included): the '
                  'bootstrap over the images, normal')
        lines += ['', f'{other} minus {base}, {name}, per corruption (mean over severities; '
                  f'varies: {varies}; {extras.replicates} replicates; '
                  f'{extras.confidence:.0%} interval; p ± its Monte-Carlo error; Holm over '
                  f'the {len(rows)} corruptions):', '',
                  '| corruption | difference | interval | p | p (Holm) | '
                  f'at family-wise {extras.alpha:g} |', '|---|---|---|---|---|---|']
        for c, r in rows:
            lines.append(f"| {c} | {_fmt(r['difference'])} | [{_fmt(r['low'])}, "
                         f"{_fmt(r['high'])}] | {_p(r['p'], r['p_se'])} | "
                         f"{_p(r['p_holm'])} | {r['verdict']} |")
        about = ('the recipes' if df else
                 'these checkpoints on these test images, not their recipes')
        lines.append(f"\n{other} is better than {base} on {count['better']} and worse on "
                     f"{count['worse']} of {len(rows)} corruptions at a family-wise error rate "
                     f'of {extras.alpha:g} (Holm), a statement about {about}.')
        if count['undecided']:
            lines.append(f"{count['undecided']} undecided: p is within {MC_Z:g} Monte-Carlo "
                         'errors of its Holm threshold, so the verdict would depend on '
                         '--bootstrap-seed; more --bootstrap replicates settle it.')
    return lines


def _p(value: float, error: Optional[float] = None) -> str:
    """A p-value, with its Monte-Carlo standard error when given."""
    if value != value:
        return '—'
    shown = f'{value:.2g}' if value >= 1e-4 else '< 0.0001'
    if error is None:
        return shown
    return f'{shown} ± {error:.1g}' if error == error else f'{shown} ± ?'


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


def _fmt(value: float, scale: float = 1.0, unit: str = '') -> str:
    """A number for tables and legends; '—' for an undefined one (rPC when P_clean is 0)."""
    if value != value:
        return '—'
    return f'{value * scale:.1f}{unit}' if unit else f'{value * scale:.3f}'


def _summaries(results_by_label: Mapping[str, Mapping],
               summaries: Optional[Mapping[str, Dict]]) -> Mapping[str, Dict]:
    return summaries if summaries is not None else {
        label: summarize(r) for label, r in results_by_label.items()}


def summary_markdown(results_by_label: Mapping[str, Mapping],
                     metrics: Optional[Sequence[str]] = None,
                     extras: Optional[Extras] = None,
                     summaries: Optional[Mapping[str, Dict]] = None) -> str:
    """Markdown: P_clean / mPC / rPC per model and metric (with their intervals).

    Then the per-corruption means, attacks, paired differences, seeds and CE (:class:`Extras`)
    follow.
    ``summaries``: :func:`summarize` of each, when the caller has them.
    """
    summaries = _summaries(results_by_label, summaries)
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
        for cat in PROTOCOL_CATEGORIES:
            values = [s['metrics'].get(name, {}).get('per_category', {}).get(cat, float('nan'))
                      for s in summaries.values()]
            if any(v == v for v in values):
                lines.append(f'| *{cat}* | ' + ' | '.join(_fmt(v) for v in values) + ' |')
    notes = [f'{label}: {r["aggregate"]}' for label, r in results_by_label.items()
             if r.get('aggregate')]
    if notes:
        lines += [''] + notes
    for kind in CELL_KINDS.values():  # NOTE: each kind's own section, in run order
        lines += kind.report_markdown(results_by_label, metrics, extras)
    lines += _extras_markdown(extras)
    return '\n'.join(lines)


def write_csv(results_by_label: Mapping[str, Mapping], out_dir: str,
              extras: Optional[Extras] = None,
              summaries: Optional[Mapping[str, Dict]] = None) -> Tuple[str, str]:
    """Write ``cells.csv`` (every model, metric, corruption, severity) and ``summary.csv``.

    Both carry their intervals (empty where there are none); ``paired.csv``,
    ``per_corruption_tests.csv``, ``seeds.csv`` and ``corruption_error.csv`` are written when
    :class:`Extras` has them. Returns the first two paths.
    """
    os.makedirs(out_dir, exist_ok=True)
    extras = extras or Extras()
    summaries = _summaries(results_by_label, summaries)
    cells_path, summary_path = osp.join(out_dir, 'cells.csv'), osp.join(out_dir, 'summary.csv')
    with atomic_write(cells_path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['model', 'corruption', 'category', 'severity', 'metric', 'value',
                         'ci_low', 'ci_high'])
        for label, results in results_by_label.items():
            for corruption, by_severity in results['cells'].items():
                category = _category(corruption)
                for severity, scores in sorted(by_severity.items(), key=lambda kv: int(kv[0])):
                    for metric, value in scores.items():
                        iv = extras.cell_intervals.get(label, {}).get(metric, {}).get(
                            (corruption, int(severity)), ('', ''))
                        writer.writerow([label, corruption, category, severity, metric, value,
                                         *iv])
    with atomic_write(summary_path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['model', 'metric', 'P_clean', 'mPC', 'rPC', 'cells', 'missing',
                         'P_clean_low', 'P_clean_high', 'mPC_low', 'mPC_high', 'rPC_low',
                         'rPC_high', 'confidence', 'replicates'])
        for label, results in results_by_label.items():
            summary = summaries[label]
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
    if extras.per_corruption:
        keys = ('difference', 'low', 'high', 'p', 'p_se', 'p_holm', 'verdict', 'seed_df')
        _rows_csv(osp.join(out_dir, 'per_corruption_tests.csv'),
                  ['model', 'minus', 'metric', 'corruption', 'difference', 'ci_low', 'ci_high',
                   'p', 'p_mc_error', 'p_holm', 'verdict', 'seed_df', 'alpha', 'confidence',
                   'replicates'],
                  [[o, b, n, c, *(r[k] for k in keys), extras.alpha, extras.confidence,
                    extras.replicates] for o, b, n, c, r in extras.per_corruption])
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
    names = main_metrics(summaries)
    for kind in CELL_KINDS.values():  # NOTE: each kind's own files (attacks.csv, shifts.csv)
        kind.report_files(results_by_label, out_dir, names, extras)
    return cells_path, summary_path


def _category(name: str) -> str:
    """A cell's category, its kind's word for it (a corruption's: noise, blur, ...)."""
    try:
        return kind_of(name).category_of(name)
    except UnknownCellError:
        return ''  # NOTE: an mmdet results file's own names (the summary says what it read)


def _rows_csv(path: str, header: Sequence[str], rows: Sequence[Sequence]) -> None:
    with atomic_write(path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def plot(results_by_label: Mapping[str, Mapping], out_dir: str,
         metrics: Optional[Sequence[str]] = None, extras: Optional[Extras] = None,
         summaries: Optional[Mapping[str, Dict]] = None) -> List[str]:
    """Per-corruption bars and per-severity curves, models side by side.

    Also P_clean / mPC / rPC with their intervals where :class:`Extras` has them. Returns the
    PNGs.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import numpy as np

    os.makedirs(out_dir, exist_ok=True)
    summaries = _summaries(results_by_label, summaries)
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

        written += [p for kind in CELL_KINDS.values()  # NOTE: each kind's own plots
                    for p in kind.report_plots(results_by_label, out_dir, [name], extras)]
        if extras is not None and name in extras.effective:
            written.append(_effective_plot(extras.effective[name], name, extras,
                                           osp.join(out_dir, f'effective_robustness_{safe}.png')))
        if extras is not None and any(name in by for by in extras.intervals.values()):
            written.append(_interval_plot(summaries, extras, name,
                                          osp.join(out_dir, f'intervals_{safe}.png')))

    return written


def write_report(results_by_label: Mapping[str, Mapping], out_dir: str,
                 metrics: Optional[Sequence[str]] = None, extras: Optional[Extras] = None
                 ) -> Tuple[str, List[str]]:
    """The whole report of some results (what both tools write).

    The Markdown (returned), the CSV files and the plots in ``out_dir`` (their paths returned), the
    summaries computed once.
    """
    summaries = _summaries(results_by_label, None)
    markdown = summary_markdown(results_by_label, metrics, extras, summaries)
    paths = list(write_csv(results_by_label, out_dir, extras, summaries))
    paths += plot(results_by_label, out_dir, metrics, extras, summaries)
    return markdown, paths


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
    """MPC against P_clean: every model.

    Intervals of its effective robustness as error bars around its mPC. The baselines' trend, each
    model's distance above it.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    from .comparisons import trend_at
    from .uncertainty import metric_scale
    scale = metric_scale(name)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    models = er['models']
    xs = np.array([m['P_clean'] for m in models.values()])
    span = np.linspace(max(xs.min() - 0.1 * scale, 1e-3 * scale),
                       min(xs.max() + 0.1 * scale, scale * (1 - 1e-3)), 100)
    ax.plot(span, trend_at(er['slope'], er['intercept'], span / scale, er['axis']) * scale, 'k--',
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
