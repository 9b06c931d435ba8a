"""Tables, CSV and plots of robustness results (mmrobust JSON or mmdet 3.3 ``*_results.pkl``)."""
import csv
import os
import os.path as osp
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..corruptions import CATEGORIES, CORRUPTIONS, Protocol
from ..utils.io import save_figure
from .metrics import robustness_summary
from .results import load_results

__all__ = ['load_results', 'summarize', 'summary_markdown', 'write_csv', 'plot']

# metrics shown by default, in this order, when present
MAIN_METRICS = ('bbox_mAP', 'segm_mAP', 'mIoU', 'AP', 'mAP')


def _protocol_of(results: Mapping) -> Optional[Protocol]:
    planned = results.get('cells_planned')
    if not planned:
        return None
    return Protocol(results.get('protocol', 'custom'), '',
                    {c: tuple(int(s) for s in sevs) for c, sevs in planned.items()})


def summarize(results: Mapping) -> Dict:
    return robustness_summary(results['cells'], _protocol_of(results))


def adversarial_curves(results: Mapping) -> Dict[str, Dict[str, List[Tuple[float, float]]]]:
    """``{metric: {attack: [(epsilon, value), ...]}}`` of a results file's attack cells, from
    epsilon 0 (the clean score) up; empty without attacks."""
    curves: Dict[str, Dict[str, List[Tuple[float, float]]]] = {}
    clean = results['cells'].get('clean', {})
    clean = clean.get(0, clean.get('0', {}))
    for attack, entry in (results.get('attacks') or {}).items():
        by_index = results['cells'].get(attack, {})
        for k, eps in enumerate(entry['epsilons'], start=1):
            scores = by_index.get(k, by_index.get(str(k)))
            for metric, value in (scores or {}).items():
                points = curves.setdefault(metric, {}).setdefault(attack, [])
                if not points and metric in clean and eps > 0:
                    points.append((0.0, float(clean[metric])))
                points.append((float(eps), float(value)))
    return curves


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
                  '| model | attack | epsilon | epsilon x 255 | value |', '|---|---|---|---|---|']
        lines += [f'| {label} | {attack} | {eps:.5g} | {eps * 255:.3g} | {_fmt(value)} |'
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
                     metrics: Optional[Sequence[str]] = None) -> str:
    """Markdown: P_clean / mPC / rPC per model and metric, then the per-corruption means."""
    summaries = {label: summarize(r) for label, r in results_by_label.items()}
    metrics = list(metrics) if metrics else main_metrics(summaries)
    lines = ['| model | metric | P_clean | mPC | rPC % | cells |', '|---|---|---|---|---|---|']
    for label, summary in summaries.items():
        missing = len(summary['missing'])
        cells = f"{summary['cells']}" + (f' ({missing} missing)' if missing else '')
        for name in metrics:
            m = summary['metrics'].get(name)
            if m:
                lines.append(f"| {label} | {name} | {_fmt(m['P_clean'])} | {_fmt(m['mPC'])} | "
                             f"{_fmt(m['rPC'], 100)} | {cells} |")
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
    lines += _adversarial_markdown(results_by_label, metrics)
    return '\n'.join(lines)


def write_csv(results_by_label: Mapping[str, Mapping], out_dir: str) -> Tuple[str, str]:
    """``cells.csv`` (every model, metric, corruption, severity) and ``summary.csv``."""
    os.makedirs(out_dir, exist_ok=True)
    cells_path, summary_path = osp.join(out_dir, 'cells.csv'), osp.join(out_dir, 'summary.csv')
    with open(cells_path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['model', 'corruption', 'category', 'severity', 'metric', 'value'])
        for label, results in results_by_label.items():
            for corruption, by_severity in results['cells'].items():
                category = CORRUPTIONS[corruption].category if corruption in CORRUPTIONS else (
                    'adversarial' if corruption in (results.get('attacks') or {}) else '')
                for severity, scores in sorted(by_severity.items(), key=lambda kv: int(kv[0])):
                    for metric, value in scores.items():
                        writer.writerow([label, corruption, category, severity, metric, value])
    with open(summary_path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['model', 'metric', 'P_clean', 'mPC', 'rPC', 'cells', 'missing'])
        for label, results in results_by_label.items():
            summary = summarize(results)
            for metric, m in summary['metrics'].items():
                writer.writerow([label, metric, m['P_clean'], m['mPC'], m['rPC'],
                                 summary['cells'], len(summary['missing'])])
    curves = {label: adversarial_curves(r) for label, r in results_by_label.items()}
    if any(curves.values()):
        with open(osp.join(out_dir, 'attacks.csv'), 'w', newline='') as f:
            writer = csv.writer(f)
            writer.writerow(['model', 'attack', 'epsilon', 'metric', 'value'])
            for label, by_metric in curves.items():
                for metric, by_attack in by_metric.items():
                    for attack, points in by_attack.items():
                        for eps, value in points:
                            writer.writerow([label, attack, eps, metric, value])
    return cells_path, summary_path


def plot(results_by_label: Mapping[str, Mapping], out_dir: str,
         metrics: Optional[Sequence[str]] = None) -> List[str]:
    """Per-corruption bars and per-severity curves, models side by side; returns the PNGs."""
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

        curves = {label: adversarial_curves(r).get(name, {})
                  for label, r in results_by_label.items()}
        if any(curves.values()):
            fig, ax = plt.subplots(figsize=(5.5, 4))
            for i, (label, by_attack) in enumerate(curves.items()):
                for j, (attack, points) in enumerate(by_attack.items()):
                    ax.plot([e * 255 for e, _ in points], [v for _, v in points], marker='o',
                            color=f'C{i}', linestyle=('-', '--', ':', '-.')[j % 4],
                            label=f'{label} {attack}')
            ax.set_xlabel('epsilon x 255 (0 = clean)')
            written.append(_finish(fig, ax, name, f'{name} under attack',
                                   osp.join(out_dir, f'adversarial_{safe}.png')))
    return written


def _finish(fig, ax, ylabel: str, title: str, path: str) -> str:
    """Label, lay out, save and close a figure; returns its path."""
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
