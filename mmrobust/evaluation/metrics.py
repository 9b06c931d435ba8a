"""Corruption-robustness metrics (Michaelis et al. 2019), shared by detection and segmentation.

P_clean is the score on the clean set, mPC the mean over a protocol's (corruption, severity)
cells and rPC = mPC / P_clean.
"""
from typing import Dict, List, Mapping, Optional, Sequence

from ..corruptions import CATEGORIES, CORRUPTIONS, Protocol

__all__ = ['CLEAN', 'Cells', 'robustness_summary']

CLEAN = 'clean'

#: Results cells: {corruption: {severity: {metric: value}}}, the clean set as {'clean': {0: ...}}.
Cells = Mapping[str, Mapping[int, Mapping[str, float]]]


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float('nan')


def robustness_summary(cells: Cells, protocol: Optional[Protocol] = None) -> Dict:
    """P_clean, mPC and rPC for every metric, per corruption, per category and overall.

    mPC is the flat mean of P over the protocol's (corruption, severity) cells; per-corruption
    values are means over that corruption's severities and per-category values the flat mean over
    the category's cells; rPC = mPC / P_clean. Cells missing from ``cells`` are left out of the
    means and counted in ``missing``.

    Args:
        cells: results as {corruption: {severity: {metric: value}}}, with the clean scores under
            ``cells['clean'][0]``. Severities may be ints or strings (JSON keys).
        protocol: the cells to average over; default: every corrupted cell present.

    Returns:
        ``{'metrics': {metric: {'P_clean', 'mPC', 'rPC', 'per_corruption': {c: mean},
        'per_category': {cat: mean}, 'per_severity': {s: mean}}}, 'cells': n, 'missing': [...]}``
    """
    def get(corruption: str, severity: int) -> Optional[Mapping[str, float]]:
        by_severity = cells.get(corruption) or {}
        return by_severity.get(severity, by_severity.get(str(severity)))

    from .attacks import is_attack_cell  # NOTE: attack cells are not corruptions
    wanted = protocol.cells() if protocol is not None else [
        (c, int(s)) for c, sevs in cells.items()
        if c != CLEAN and not is_attack_cell(c) for s in sevs]
    present = [(c, s, get(c, s)) for c, s in wanted if get(c, s) is not None]
    missing = [(c, s) for c, s in wanted if get(c, s) is None]
    clean = get(CLEAN, 0) or {}
    names: List[str] = []
    for scores in [clean] + [r for _, _, r in present]:
        names += [k for k, v in scores.items() if k not in names and isinstance(v, (int, float))]

    metrics = {}
    for name in names:
        values = [(c, s, float(r[name])) for c, s, r in present if name in r]
        m_pc = _mean([v for _, _, v in values])
        p_clean = float(clean[name]) if name in clean else float('nan')
        per_corruption = {c: _mean([v for c2, _, v in values if c2 == c])
                          for c in dict.fromkeys(c for c, _, _ in values)}
        per_category = {cat: _mean([v for c, _, v in values if CORRUPTIONS[c].category == cat])
                        for cat in CATEGORIES
                        if any(CORRUPTIONS[c].category == cat for c, _, _ in values)}
        per_severity = {s: _mean([v for _, s2, v in values if s2 == s])
                        for s in sorted({s for _, s, _ in values})}
        metrics[name] = {
            'P_clean': p_clean, 'mPC': m_pc,
            'rPC': m_pc / p_clean if p_clean and p_clean == p_clean else float('nan'),
            'per_corruption': per_corruption, 'per_category': per_category,
            'per_severity': per_severity}
    return {'metrics': metrics, 'cells': len(present), 'missing': missing}
