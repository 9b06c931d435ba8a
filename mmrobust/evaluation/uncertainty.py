"""How certain robustness numbers are: bootstrap intervals, paired differences, seeds, CE / mCE.

- **Bootstrap over images** (Efron & Tibshirani 1993, percentile intervals): a replicate draws N
  of a cell's N images with replacement and recomputes the metric from the per-image statistics
  the run kept (:mod:`.per_image`). Every cell of a results file is the same images under
  another corruption, so one replicate uses the same draw in every cell: P_clean, each cell, mPC
  and rPC = mPC / P_clean are computed on the same resampled set, and so are the numbers of a
  second model evaluated on the same images (a paired comparison: the interval of the
  difference, narrower than two separate intervals suggest).
- **Seeds**: several results files of one recipe (trained with different seeds) give the mean
  and the sample standard deviation across them (the training noise the bootstrap over test
  images does not see).
- **Corruption Error** (Hendrycks & Dietterich 2019, ImageNet-C) against a reference model, with
  errors E = S - P (S = 1 for AP, 100 for mIoU in %): CE_c = sum_s E_c,s / sum_s E^ref_c,s,
  mCE the mean over corruptions; relative CE_c = sum_s (E_c,s - E_clean) /
  sum_s (E^ref_c,s - E^ref_clean) and relative mCE its mean. FAN's "retention rate" is rPC.
"""
import os.path as osp
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..utils.errors import MMRobustError
from .cell_kinds import counts_in_mpc, kind_of
from .metrics import CLEAN, mean_over_corruptions
from .per_image import load_cell_stats, scorer, stats_folders, stats_path
from .results import corruption_cells, evaluation_sha256
from .significance import difference_test

__all__ = ['DEFAULT_REPLICATES', 'Bootstrap', 'CellStats', 'PairingError', 'bootstrap_weights',
           'cell_stats', 'check_pairable', 'corruption_errors', 'interval', 'metric_scale',
           'paired_differences', 'replicate_summary', 'replicates_of',
           'seed_statistics', 'without_sentinels']

Cell = Tuple[str, int]
# mmseg reports these in %, so their error is 100 - P
_PERCENT_METRICS = ('aAcc', 'mIoU', 'mAcc', 'mDice', 'mFscore', 'mPrecision', 'mRecall')


class PairingError(MMRobustError, ValueError):
    """Two results files whose numbers cannot be paired (the message names the difference)."""


#: Replicates by default: the Monte-Carlo error of a 2.5% percentile endpoint is ~0.1 of the
#: replicates' sigma at 1000 (~0.2 at 200); docs/en/notes/benchmarks.md has what they cost.
DEFAULT_REPLICATES = 1000


@dataclass(frozen=True)
class Bootstrap:
    """Replicates, confidence level and the seed of the resampling.

    One seed for every model: the same images are drawn for all of them.
    """
    replicates: int = DEFAULT_REPLICATES
    confidence: float = 0.95
    seed: int = 0


def metric_scale(name: str) -> float:
    """The score of a perfect model: 100 for mmseg's percentages, else 1 (COCO AP)."""
    return 100.0 if name.split('/')[-1] in _PERCENT_METRICS else 1.0


def bootstrap_weights(images: int, replicates: int, seed: int) -> np.ndarray:
    """``(replicates, images)`` draw counts: each row draws ``images`` images with replacement."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(images, np.full(images, 1.0 / images), size=replicates).astype(
        np.float64)


def interval(samples: np.ndarray, confidence: float) -> Tuple[float, float]:
    """The percentile interval of bootstrap replicates (NaN replicates left out)."""
    samples = np.asarray(samples, dtype=np.float64)
    samples = samples[~np.isnan(samples)]
    if not samples.size:
        return float('nan'), float('nan')
    tail = 100 * (1 - confidence) / 2
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return float(lo), float(hi)


@dataclass
class CellStats:
    """A results file's per-image statistics.

    The images (in one order) and, per cell, the scorers with the index of each of their images in
    that order.
    """
    images: List[str]
    cells: Dict[Cell, List[Tuple[Any, np.ndarray]]] = field(default_factory=dict)
    missing: List[Cell] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    #: real-world shift cells, each over images of its own set: ``{cell: (images, scorers)}``
    shifts: Dict[Cell, Tuple[List[str], List[Tuple[Any, np.ndarray]]]] = field(
        default_factory=dict)

    def scores(self, cell: Cell, weights: np.ndarray) -> Dict[str, np.ndarray]:
        """``{metric: (R,)}`` of a cell for weights ``(R, len(images))``.

        NaN where a replicate has no value (:func:`without_sentinels`).
        """
        out: Dict[str, np.ndarray] = {}
        for score, index in self.cells[cell]:
            out.update(without_sentinels(score.values(weights[:, index])))
        return out


def without_sentinels(values: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Replicates with pycocotools' -1 as NaN.

    A -1 is an area range or a group without ground truth in the resampled images: no value, not
    a score of -1. Intervals, means and differences leave a NaN out instead of averaging it in.
    """
    return {k: np.where(np.asarray(v, dtype=np.float64) == -1.0, np.nan, v)
            for k, v in values.items()}


#: What recomputes a results file's missing per-image statistics (``tools/test_robustness.py``)
REFRESH_HINT = ('rerun the test_robustness.py command that wrote the results with '
                '--refresh-per-image to recompute them (those cells are inferred again)')


def cell_stats(results_path: str, results: Mapping) -> CellStats:
    """The per-image statistics of every recorded cell of a results file.

    Side files of its run, or of the shards it was merged from. Cells without them are listed in
    ``missing`` and ``notes`` says why.
    """
    fingerprint = evaluation_sha256(results)
    folders = stats_folders(results_path, results)
    stats = CellStats(images=[])
    foreign = []
    found: Dict[Cell, List[Any]] = {}
    for corruption, by_severity in results['cells'].items():
        for severity in by_severity:
            cell = (corruption, int(severity))
            paths = [stats_path(f, *cell) for f in folders]
            path = next((p for p in paths if osp.isfile(p)), None)
            if path is None:
                stats.missing.append(cell)
                continue
            loaded = load_cell_stats(path)
            if loaded['meta'].get('fingerprint') != fingerprint:
                foreign.append(path)
                stats.missing.append(cell)
                continue
            found[cell] = [scorer(b) for b in loaded['blocks']]
    if foreign:
        stats.notes.append(f'{len(foreign)} per-image file(s) belong to another evaluation and '
                           f'were not used (e.g. {foreign[0]}): {REFRESH_HINT}')
    if stats.missing and not foreign:
        stats.notes.append(
            f'{len(stats.missing)} cell(s) have no per-image statistics in '
            f'{folders[0]} (a run with --no-per-image-stats, an mmrobust before them, or a '
            f'metric that keeps none): {REFRESH_HINT}')
    for cell in [c for c in found if kind_of(c[0]).own_images]:
        scorers = found.pop(cell)
        own = sorted({i for s in scorers for i in s.images})
        position = {name: k for k, name in enumerate(own)}
        stats.shifts[cell] = (own, [(s, np.array([position[i] for i in s.images]))
                                    for s in scorers])
    if not found:
        return stats
    images = sorted({i for scorers in found.values() for s in scorers for i in s.images})
    stats.images = images
    position = {name: k for k, name in enumerate(images)}
    for cell, scorers in found.items():
        uneven = [s for s in scorers if len(s.images) != len(images)]
        if uneven:
            stats.notes.append(f'cell {cell[0]} {cell[1]} holds {len(uneven[0].images)} of the '
                               f'{len(images)} images of the other cells; not resampled')
            stats.missing.append(cell)
            continue
        stats.cells[cell] = [(s, np.array([position[i] for i in s.images])) for s in scorers]
    return stats


def replicate_summary(stats: CellStats, weights: np.ndarray,
                      protocol_cells: Sequence[Cell]) -> Dict[str, Dict[str, Any]]:
    """Bootstrap replicates of every number of the summary.

    ``{metric: {'P_clean': (R,), 'mPC': (R,), 'rPC': (R,), 'cells': {cell: (R,)}}}``. mPC / rPC only
    where every cell of the protocol (and the clean set) has statistics.
    """
    per_cell = {cell: stats.scores(cell, weights) for cell in stats.cells}
    names = sorted({n for scores in per_cell.values() for n in scores})
    out: Dict[str, Dict[str, Any]] = {}
    for name in names:
        cells = {cell: scores[name] for cell, scores in per_cell.items() if name in scores}
        entry: Dict[str, Any] = {'cells': cells}
        if (CLEAN, 0) in cells:
            entry['P_clean'] = cells[(CLEAN, 0)]
        if protocol_cells and all(c in cells for c in protocol_cells):
            # NOTE: the point estimate's estimator (per-corruption severity means averaged)
            entry['mPC'] = np.asarray(mean_over_corruptions({c: cells[c]
                                                             for c in protocol_cells}))
            if 'P_clean' in entry:
                with np.errstate(divide='ignore', invalid='ignore'):
                    entry['rPC'] = entry['mPC'] / entry['P_clean']
        out[name] = entry
    return out


def check_pairable(a: Tuple[str, Mapping, CellStats], b: Tuple[str, Mapping, CellStats]
                   ) -> None:
    """Raise :class:`PairingError` unless both files scored the same images.

    Under the same corruptions: the same cells, corruption seed and colour order, and image set.
    """
    (name_a, res_a, st_a), (name_b, res_b, st_b) = a, b
    problems = []
    for key in ('cells_planned', 'seed', 'bgr_compat'):
        if res_a.get(key) != res_b.get(key):
            problems.append(f'{key}: {name_a} has {res_a.get(key)!r}, {name_b} '
                            f'{res_b.get(key)!r}')
    if st_a.images != st_b.images:
        only_a = sorted(set(st_a.images) - set(st_b.images))
        only_b = sorted(set(st_b.images) - set(st_a.images))
        problems.append(
            f'images: {name_a} has {len(st_a.images)}, {name_b} {len(st_b.images)}; '
            f'{len(only_a)} only in {name_a} (e.g. {only_a[:3]}), {len(only_b)} only in '
            f'{name_b} (e.g. {only_b[:3]})')
    if problems:
        raise PairingError(f'{name_a} and {name_b} were not evaluated on the same images, so '
                           'their difference cannot be paired:\n  ' + '\n  '.join(problems))


def paired_differences(base: Sequence[Dict[str, Dict[str, Any]]],
                       other: Sequence[Dict[str, Dict[str, Any]]],
                       base_points: Sequence[Dict], other_points: Sequence[Dict],
                       confidence: float, seeds: bool = False
                       ) -> Dict[str, Dict[str, Tuple[float, float, float]]]:
    """``{metric: {quantity: (difference, lo, hi)}}`` of other minus base.

    Each a list of seeds' replicate summaries over the same draws; P_clean, mPC and rPC.
    ``seeds``: where a recipe has two seeds or more, the interval includes the between-seed
    variance (:func:`~.significance.difference_test`); otherwise the seeds are averaged and the
    interval is the percentile interval over the images.
    """
    out: Dict[str, Dict[str, Tuple[float, float, float]]] = {}
    for name in base[0]:
        if not all(name in r for r in list(base) + list(other)):
            continue
        row = {}
        for q in ('P_clean', 'mPC', 'rPC'):
            if not all(q in r[name] for r in list(base) + list(other)):
                continue
            points = [p['metrics'].get(name, {}).get(q) for p in list(base_points)
                      + list(other_points)]
            if any(v is None for v in points):
                continue
            point = (np.mean([p['metrics'][name][q] for p in other_points])
                     - np.mean([p['metrics'][name][q] for p in base_points]))
            if seeds and max(len(base), len(other)) > 1:
                test = difference_test([r[name][q] for r in base], [r[name][q] for r in other],
                                       [p['metrics'][name][q] for p in base_points],
                                       [p['metrics'][name][q] for p in other_points],
                                       confidence, seeds=True)
                row[q] = (float(point), test['low'], test['high'])
                continue
            diff = (np.mean([r[name][q] for r in other], axis=0)
                    - np.mean([r[name][q] for r in base], axis=0))
            row[q] = (float(point), *interval(diff, confidence))
        if row:
            out[name] = row
    return out


def seed_statistics(summaries: Sequence[Dict]) -> Dict[str, Dict[str, Tuple[int, float, float]]]:
    """``{metric: {quantity: (n, mean, sample std)}}`` across the results of several seeds."""
    out: Dict[str, Dict[str, Tuple[int, float, float]]] = {}
    names = [n for n in summaries[0]['metrics']
             if all(n in s['metrics'] for s in summaries)]
    for name in names:
        row = {}
        for q in ('P_clean', 'mPC', 'rPC'):
            values = np.array([s['metrics'][name][q] for s in summaries], dtype=np.float64)
            std = float(np.std(values, ddof=1)) if len(values) > 1 else float('nan')
            row[q] = (len(values), float(np.mean(values)), std)
        out[name] = row
    return out


#: A reference whose mean drop from clean is under this share of the metric's scale makes
#: relative CE unstable (its denominator).
NEAR_ZERO_DROP = 0.005


def corruption_errors(cells: Mapping, reference: Mapping, metric: str,
                      corruptions: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """CE and relative CE per corruption, mCE and relative mCE.

    ImageNet-C's definitions with E = S - P, of ``cells`` against ``reference`` cells, for one
    metric.

    Raises:
        ValueError: the reference lacks a cell or the metric (named), or its errors sum to 0.
    """
    scale = metric_scale(metric)

    def p(source: Mapping, corruption: str, severity: int) -> float:
        by_sev = source.get(corruption) or {}
        scores = by_sev.get(severity, by_sev.get(str(severity)))
        if scores is None or metric not in scores:
            raise KeyError(f'{corruption} {severity}')
        return float(scores[metric])

    names = corruptions or [c for c in cells if counts_in_mpc(c)]
    per: Dict[str, Dict[str, float]] = {}
    missing: List[str] = []
    warnings: List[str] = []
    for c in names:
        sevs = sorted(int(s) for s in cells[c])
        try:
            err = sum(scale - p(cells, c, s) for s in sevs)
            ref = sum(scale - p(reference, c, s) for s in sevs)
            rel = sum(p(cells, CLEAN, 0) - p(cells, c, s) for s in sevs)
            rel_ref = sum(p(reference, CLEAN, 0) - p(reference, c, s) for s in sevs)
        except KeyError as err_key:
            missing.append(str(err_key).strip("'"))
            continue
        per[c] = {'CE': err / ref if ref else float('nan'),
                  'relative_CE': rel / rel_ref if rel_ref else float('nan')}
        if abs(rel_ref) < NEAR_ZERO_DROP * scale * len(sevs):
            warnings.append(
                f'the reference loses almost nothing under {c} ({rel_ref / len(sevs):+.4g} per '
                'severity): its relative CE divides by that drop, so it explodes or flips sign')
    if missing:
        raise ValueError(f'the reference has no {metric} for: {", ".join(missing)}; CE needs '
                         'the reference evaluated on the same cells')
    return {'per_corruption': per,
            'mCE': float(np.mean([v['CE'] for v in per.values()])) if per else float('nan'),
            'relative_mCE': float(np.mean([v['relative_CE'] for v in per.values()]))
            if per else float('nan'), 'warnings': warnings}


def corruption_error_replicates(replicate_cells: Mapping[Cell, np.ndarray], cells: Mapping,
                                reference: Mapping, metric: str, corruptions: Sequence[str]
                                ) -> Optional[Dict[str, np.ndarray]]:
    """mCE and relative mCE per bootstrap replicate.

    ``{'mCE': (R,), 'relative_mCE': (R,)}`` from a run's replicate cells, the reference held at
    its recorded numbers (its own sampling is not in the interval); None where a cell has no
    replicates.
    """
    scale = metric_scale(metric)

    def ref(corruption: str, severity: int) -> float:
        by_sev = reference.get(corruption) or {}
        return float(by_sev.get(severity, by_sev.get(str(severity)))[metric])

    clean = replicate_cells.get((CLEAN, 0))
    if clean is None:
        return None
    ces, rels = [], []
    for c in corruptions:
        sevs = sorted(int(s) for s in cells[c])
        if not all((c, s) in replicate_cells for s in sevs):
            return None
        ref_err = sum(scale - ref(c, s) for s in sevs)
        ref_drop = sum(ref(CLEAN, 0) - ref(c, s) for s in sevs)
        ces.append(sum(scale - replicate_cells[(c, s)] for s in sevs) / ref_err
                   if ref_err else np.full_like(clean, np.nan))
        rels.append(sum(clean - replicate_cells[(c, s)] for s in sevs) / ref_drop
                    if ref_drop else np.full_like(clean, np.nan))
    return {'mCE': np.mean(ces, axis=0), 'relative_mCE': np.mean(rels, axis=0)}


def replicates_of(results_path: str, results: Mapping, boot: Bootstrap,
                  stats: Optional[CellStats] = None) -> Tuple[CellStats, Dict]:
    """A results file's per-image statistics and its replicate summary.

    The summary is empty without statistics.
    """
    stats = stats or cell_stats(results_path, results)
    summary: Dict[str, Dict[str, Any]] = {}
    if stats.cells:
        weights = bootstrap_weights(len(stats.images), boot.replicates, boot.seed)
        summary = replicate_summary(stats, weights, corruption_cells(results))
    for cell, (images, scorers) in stats.shifts.items():
        # NOTE: a shift cell's images are its own: resampled alone, with a draw of its own
        # that every model shares (seeded by the cell), so its interval is the cell's score's
        seed = zlib.crc32(f'{boot.seed} {cell[0]} {cell[1]}'.encode())
        weights = bootstrap_weights(len(images), boot.replicates, seed)
        for score, index in scorers:
            for name, values in without_sentinels(score.values(weights[:, index])).items():
                summary.setdefault(name, {'cells': {}})['cells'][cell] = values
    return stats, summary

