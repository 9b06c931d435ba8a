"""The report's adversarial part: each attack's score against its budget.

The attack kind's section of the report (:class:`~.cell_kinds.attack.AttackKind`): per metric,
a table of every attack cell (and the per-image worst case over them) from epsilon 0, the
clean score, up, with how hard each attack tried; ``attacks.csv``; one plot per metric.
"""
import csv
import os
import os.path as osp
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..utils.io import atomic_write, save_figure
from .cells import WORST

__all__ = ['adversarial_curves', 'attack_markdown', 'attack_setting', 'plot_attacks',
           'write_attack_csv']


def _fmt(value: float) -> str:
    return '—' if value != value else f'{value:.3f}'


def adversarial_curves(results: Mapping) -> Dict[str, Dict[str, List[Tuple[float, float]]]]:
    """``{metric: {attack: [(epsilon, value), ...]}}`` of a results file's attack cells.

    Ordered from epsilon 0 (the clean score) up; empty without attacks.
    """
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
    """How hard ``attack`` tried, to print next to its figures.

    ``10 steps, random start`` (and the restarts when more than one); an attack's strength is only
    comparable with it.
    """
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


def attack_markdown(results_by_label: Mapping[str, Mapping], metrics: Sequence[str],
                    extras: Optional[Any] = None) -> List[str]:
    """Per metric, the "under attack" table (empty without attack cells)."""
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


def write_attack_csv(results_by_label: Mapping[str, Mapping], out_dir: str,
                     metrics: Sequence[str], extras: Optional[Any] = None) -> List[str]:
    """``attacks.csv``: every model's attack curves, all metrics ([] without attack cells)."""
    curves = {label: adversarial_curves(r) for label, r in results_by_label.items()}
    if not any(curves.values()):
        return []
    os.makedirs(out_dir, exist_ok=True)
    path = osp.join(out_dir, 'attacks.csv')
    with atomic_write(path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['model', 'attack', 'epsilon', 'metric', 'value', 'setting'])
        for label, by_metric in curves.items():
            for metric, by_attack in by_metric.items():
                for attack, points in by_attack.items():
                    setting = attack_setting(results_by_label[label], attack)
                    for eps, value in points:
                        writer.writerow([label, attack, eps, metric, value, setting])
    return [path]


def plot_attacks(results_by_label: Mapping[str, Mapping], out_dir: str, metrics: Sequence[str],
                 extras: Optional[Any] = None) -> List[str]:
    """Per metric, every model's attacks against epsilon: ``adversarial_<metric>.png``."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    written = []
    for name in metrics:
        curves = {label: adversarial_curves(r).get(name, {})
                  for label, r in results_by_label.items()}
        if not any(curves.values()):
            continue
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for i, (label, by_attack) in enumerate(curves.items()):
            for j, (attack, points) in enumerate(by_attack.items()):
                ax.plot([e * 255 for e, _ in points], [v for _, v in points], marker='o',
                        color=f'C{i}', linestyle=('-', '--', ':', '-.')[j % 4],
                        label=f'{label} {attack} '
                              f'({attack_setting(results_by_label[label], attack)})')
        ax.set_xlabel('epsilon x 255 (0 = clean)')
        ax.set_ylabel(name)
        ax.set_title(f'{name} under attack')
        ax.legend(fontsize=8)
        written.append(save_figure(fig, osp.join(out_dir,
                                                 f'adversarial_{name.replace("/", "_")}.png')))
    return written
