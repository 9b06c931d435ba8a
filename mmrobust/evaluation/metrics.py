"""Corruption-robustness metrics (Michaelis et al. 2019), shared by detection and segmentation.

P_clean is the score on the clean set, mPC the mean over a protocol's corruptions of each
corruption's mean over its severities, and rPC = mPC / P_clean. With the same severities for
every corruption (COCO-C) that is the flat mean over the cells; Cityscapes-C evaluates noise
at severities 1-3 only, and SegFormer's and FAN's tables average the per-corruption means, so a
corruption weighs the same whatever its number of severities.
"""
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..corruptions import CORRUPTIONS, PROTOCOL_CATEGORIES, Protocol
from .cell_kinds import CLEAN, counts_in_mpc

__all__ = ['CLEAN', 'Cells', 'MAIN_METRICS', 'is_main_metric', 'mean_over_corruptions',
           'robustness_summary']

#: The headline metrics (the last part of a metric's name), in the order tables show them:
#: panoptic quality (mmdet's ``CocoPanopticMetric``), box / mask AP, mIoU, then the generic names.
MAIN_METRICS = ('PQ', 'bbox_mAP', 'segm_mAP', 'mIoU', 'AP', 'mAP')


def is_main_metric(name: str) -> bool:
    """Whether a recorded metric (``coco_panoptic/PQ``, ``coco/bbox_mAP``, ``mIoU``) headlines."""
    return name.split('/')[-1] in MAIN_METRICS

#: Results cells: {corruption: {severity: {metric: value}}}, the clean set as {'clean': {0: ...}}.
Cells = Mapping[str, Mapping[int, Mapping[str, float]]]


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float('nan')


def mean_over_corruptions(values: Mapping[Tuple[str, int], Any]) -> Any:
    """MPC's estimator: the mean over corruptions of each corruption's mean over its severities.

    ``values[(corruption, severity)]``: numbers, or arrays of bootstrap replicates.
    """
    by_corruption: Dict[str, List[Any]] = {}
    for (corruption, _), value in values.items():
        by_corruption.setdefault(corruption, []).append(value)
    means = [sum(v) / len(v) for v in by_corruption.values()]
    return sum(means) / len(means) if means else float('nan')


def robustness_summary(cells: Cells, protocol: Optional[Protocol] = None) -> Dict:
    """P_clean, mPC and rPC for every metric, per corruption, per category and overall.

    mPC is the mean over corruptions of each corruption's mean over its severities
    (:func:`mean_over_corruptions`); per-category values are the means of the category's
    corruptions, grouped as the protocol's source groups them; rPC = mPC / P_clean. Cells
    missing from ``cells`` are left out of the means and counted in ``missing``.

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

    def category(corruption: str) -> str:
        return protocol.category(corruption) if protocol is not None else \
            CORRUPTIONS[corruption].category

    # NOTE: attack and shift cells are not corruptions
    wanted = protocol.cells() if protocol is not None else [
        (c, int(s)) for c, sevs in cells.items() if counts_in_mpc(c) for s in sevs]
    present = [(c, s, get(c, s)) for c, s in wanted if get(c, s) is not None]
    missing = [(c, s) for c, s in wanted if get(c, s) is None]
    clean = get(CLEAN, 0) or {}
    names: List[str] = []
    for scores in [clean] + [r for _, _, r in present]:
        names += [k for k, v in scores.items() if k not in names and isinstance(v, (int, float))]

    metrics = {}
    for name in names:
        values = [(c, s, float(r[name])) for c, s, r in present if name in r]
        m_pc = float(mean_over_corruptions({(c, s): v for c, s, v in values}))
        p_clean = float(clean[name]) if name in clean else float('nan')
        per_corruption = {c: _mean([v for c2, _, v in values if c2 == c])
                          for c in dict.fromkeys(c for c, _, _ in values)}
        per_category = {cat: _mean([v for c, v in per_corruption.items()
                                    if category(c) == cat])
                        for cat in PROTOCOL_CATEGORIES
                        if any(category(c) == cat for c in per_corruption)}
        per_severity = {s: _mean([v for _, s2, v in values if s2 == s])
                        for s in sorted({s for _, s, _ in values})}
        metrics[name] = {
            'P_clean': p_clean, 'mPC': m_pc,
            'rPC': m_pc / p_clean if p_clean and p_clean == p_clean else float('nan'),
            'per_corruption': per_corruption, 'per_category': per_category,
            'per_severity': per_severity}
    return {'metrics': metrics, 'cells': len(present), 'missing': missing}
