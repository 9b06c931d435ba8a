"""The report's real-world shift part.

Each shift cell's score, its drop from the clean score and its interval, as a table, a CSV and a
plot beside the corruption ones.

Shift cells (:mod:`~mmrobust.datasets.shift_sets`) are not in mPC / rPC: each is another set's
images through the model's own pipeline and metric. A cell's interval, where the results keep
per-image statistics, resamples that set's own images
(:func:`~.uncertainty.replicates_of`).
"""
import csv
import os
import os.path as osp
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from ..datasets.shift_sets import SHIFT_MEANS, is_shift_cell, shift_label
from ..utils.io import atomic_write, save_figure
from .metrics import CLEAN

__all__ = ['shift_rows', 'shift_markdown', 'write_shift_csv', 'plot_shifts']

#: (model, set, level, what it is, metric, score, clean score, drop from clean, interval)
Row = Tuple[str, str, int, str, str, float, float, float, Optional[Tuple[float, float]]]


def _score(results: Mapping, name: str, level: int, metric: str) -> float:
    """A cell's number (severities are strings in a file, integers once loaded); NaN if none."""
    by_level = results['cells'].get(name) or {}
    value = (by_level.get(str(level), by_level.get(level)) or {}).get(metric)
    return float(value) if isinstance(value, (int, float)) else float('nan')


def _clean(results: Mapping, metric: str) -> float:
    return _score(results, CLEAN, 0, metric)


def shift_rows(results_by_label: Mapping[str, Mapping], metrics: Sequence[str],
               extras: Optional[Any] = None) -> List[Row]:
    """Every model's shift cells, in the results' order, for ``metrics``."""
    rows: List[Row] = []
    for label, results in results_by_label.items():
        for name, by_level in results['cells'].items():
            if not is_shift_cell(name):
                continue
            for level, scores in sorted(by_level.items(), key=lambda kv: int(kv[0])):
                for metric in metrics:
                    if not isinstance(scores.get(metric), (int, float)):
                        continue
                    value, clean = float(scores[metric]), _clean(results, metric)
                    iv = None if extras is None else extras.cell_intervals.get(label, {}).get(
                        metric, {}).get((name, int(level)))
                    rows.append((label, name, int(level), shift_label(name, level), metric,
                                 value, clean, value - clean, iv))
        rows += _mean_rows(label, results, metrics, extras)
    return rows


def _mean_rows(label: str, results: Mapping, metrics: Sequence[str],
               extras: Optional[Any]) -> List[Row]:
    """The means papers report over a family's sets (:data:`SHIFT_MEANS`), at level 0.

    Where every one of their cells is there; the interval (``cell_intervals`` under
    ``(name, 0)``) averages the sets' own replicates.
    """
    rows: List[Row] = []
    for name, (what, cells) in SHIFT_MEANS.items():
        for metric in metrics:
            values = [_score(results, cell, level, metric) for cell, level in cells]
            if any(v != v for v in values):
                continue
            value, clean = sum(values) / len(values), _clean(results, metric)
            iv = None if extras is None else extras.cell_intervals.get(label, {}).get(
                metric, {}).get((name, 0))
            rows.append((label, name, 0, what, metric, value, clean, value - clean, iv))
    return rows


def _cell_name(name: str, level: int) -> str:
    """``foggy_cityscapes 3``; a mean over sets by its name alone."""
    return f'{name} {level}' if level else name


def _fmt(value: float) -> str:
    return '—' if value != value else f'{value:.3f}'


def shift_markdown(results_by_label: Mapping[str, Mapping], metrics: Sequence[str],
                   extras: Optional[Any] = None) -> List[str]:
    """The "real-world shift" table (empty without shift cells)."""
    rows = shift_rows(results_by_label, metrics, extras)
    if not rows:
        return []
    confidence = getattr(extras, 'confidence', 0.95)
    replicates = getattr(extras, 'replicates', 0)
    what = (f'{confidence:.0%} interval, {replicates} replicates' if replicates else
            'no interval')
    lines = ['', 'Real-world shift (another set through the same pipeline and metric; not in '
             'mPC / rPC; a shift cell\'s interval resamples its own set\'s images):', '',
             f'| model | shift | set | metric | score [{what}] | clean | drop from clean |',
             '|---|---|---|---|---|---|---|']
    for label, name, level, what, metric, value, clean, drop, iv in rows:
        shown = _fmt(value) + (f' [{_fmt(iv[0])}, {_fmt(iv[1])}]' if iv and iv[0] == iv[0]
                               else '')
        lines.append(f'| {label} | {_cell_name(name, level)} | {what} | {metric} | {shown} | '
                     f'{_fmt(clean)} | {_fmt(drop)} |')
    return lines


def write_shift_csv(results_by_label: Mapping[str, Mapping], out_dir: str,
                    metrics: Sequence[str], extras: Optional[Any] = None) -> Optional[str]:
    """``shifts.csv`` (None without shift cells)."""
    rows = shift_rows(results_by_label, metrics, extras)
    if not rows:
        return None
    os.makedirs(out_dir, exist_ok=True)
    path = osp.join(out_dir, 'shifts.csv')
    with atomic_write(path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['model', 'shift', 'level', 'set', 'metric', 'value', 'clean', 'drop',
                         'ci_low', 'ci_high'])
        for label, name, level, what, metric, value, clean, drop, iv in rows:
            writer.writerow([label, name, level, what, metric, value, clean, drop,
                             *(iv if iv else ('', ''))])
    return path


def plot_shifts(results_by_label: Mapping[str, Mapping], out_dir: str,
                metrics: Sequence[str], extras: Optional[Any] = None) -> List[str]:
    """Plot each shift cell's score per model against its clean score.

    Per metric, each shift cell's score per model (bars, with intervals where there are any) against
    its clean score (dashed): ``shifts_<metric>.png``.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import numpy as np
    written = []
    labels = list(results_by_label)
    for metric in metrics:
        rows = shift_rows(results_by_label, [metric], extras)
        if not rows:
            continue
        cells = list(dict.fromkeys((name, level) for _, name, level, *_ in rows))
        fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(cells) + 2), 4))
        width = 0.8 / max(len(labels), 1)
        xs = np.arange(len(cells))
        for i, label in enumerate(labels):
            mine = {(name, level): (value, iv, clean)
                    for lb, name, level, _, _, value, clean, _, iv in rows if lb == label}
            if not mine:
                continue
            values = [mine.get(c, (np.nan, None, np.nan))[0] for c in cells]
            errs = [[], []]
            for c, v in zip(cells, values):
                iv = mine.get(c, (np.nan, None, np.nan))[1]
                errs[0].append(max(v - iv[0], 0) if iv and iv[0] == iv[0] else 0)
                errs[1].append(max(iv[1] - v, 0) if iv and iv[1] == iv[1] else 0)
            ax.bar(xs + (i - (len(labels) - 1) / 2) * width, values, width, yerr=errs,
                   capsize=3, label=label)
            clean = next(iter(mine.values()))[2]
            ax.axhline(clean, color=f'C{i}', linestyle='--', linewidth=1)
        ax.set_xticks(xs, [_cell_name(n, lv) for n, lv in cells], rotation=45, ha='right')
        ax.set_ylabel(metric)
        ax.set_title(f'{metric} under real-world shift (dashed: clean)')
        ax.legend(fontsize=8)
        written.append(save_figure(fig, osp.join(out_dir,
                                                 f'shifts_{metric.replace("/", "_")}.png')))
    return written
