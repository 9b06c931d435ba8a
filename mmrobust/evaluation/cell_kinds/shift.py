"""The real-world shift cells: another test set through the config's pipeline and metric.

A cell ``(set, level)`` of :mod:`~mmrobust.datasets.shift_sets` (ACDC, Foggy Cityscapes, Dark
Zurich, COCO-O): its images are its own (per-image statistics pair only within it), a dataloader
each, a detection set's COCO metrics scored against its annotation file; not in mPC / rPC.
"""
import argparse
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from typing_extensions import override

from ...datasets.shift_sets import (
    SHIFT_BUNDLES,
    SHIFT_FAMILIES,
    SHIFT_SETS,
    check_shift_root,
    check_shift_task,
    parse_shifts,
    shift_ann_file,
    shift_identity,
)
from ...utils.config_checks import leaf_datasets
from ...utils.errors import UsageError
from ..cells import shift_dataloader
from ..evaluator_cfg import is_coco_metric, metric_entries
from ..shift_report import plot_shifts, shift_markdown, write_shift_csv
from . import Cell, CellRun, RunSpec
from .per_cell import PerCellKind

__all__ = ['SHIFT', 'ShiftKind']


class ShiftKind(PerCellKind):
    """Cells of another test set, one per (set, level)."""

    @override
    def planned(self, identity: Mapping) -> List[Cell]:
        return [(name, int(k)) for name, entry in (identity.get('shifts') or {}).items()
                for k in entry['levels']]

    @override
    def identity(self, spec: RunSpec) -> Dict[str, Any]:
        # NOTE: only where there are shift cells, so that a file without them keeps its
        # fingerprint (the key joins the identity keys then)
        return {'shifts': shift_identity(spec.shifts)} if spec.shifts else {}

    @override
    def check(self, spec: RunSpec) -> RunSpec:
        for name, level in spec.shifts or ():  # NOTE: a missing or mis-laid set stops here
            check_shift_root(name, level, spec.shift_roots)
        return spec

    @override
    def check_run(self, runner: Any, cfg: Any, spec: RunSpec) -> None:
        task = 'segmentation' if cfg.get('default_scope') == 'mmseg' else 'detection'
        for name in dict.fromkeys(name for name, _ in spec.shifts or ()):
            check_shift_task(name, task)

    @override
    def dataloader(self, run: CellRun, cell: Cell) -> Any:
        return shift_dataloader(self.config(run), cell, run.spec.shift_roots)

    def evaluator(self, evaluator_cfg: Any, cell: Cell, spec: RunSpec) -> Any:
        """A detection set's COCO metrics score against its own annotation file."""
        ann = shift_ann_file(*cell, spec.shift_roots)
        if ann:
            for entry in metric_entries(evaluator_cfg):
                if is_coco_metric(entry):
                    entry['ann_file'] = ann
        return evaluator_cfg

    def image_roots(self, cfg: Any, cell: Cell, spec: RunSpec) -> Tuple[str, ...]:
        """Its own set's root: its images' paths are relative to it."""
        loader = shift_dataloader(cfg, cell, spec.shift_roots)
        return (str(leaf_datasets(loader['dataset'])[0]['data_root']), )

    @override
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group('real-world shift cells')
        group.add_argument('--shifts', nargs='+', default=None, metavar='SHIFT',
                           help="real-world shift cells (the config's pipeline and metric on "
                                'another set, not in mPC): sets '
                                f'({", ".join(SHIFT_SETS)}), SET:LEVEL, foggy_<beta>, or '
                                f'bundles ({", ".join(SHIFT_BUNDLES)}); without --protocol / '
                                '--corruptions only the cells asked for run')
        group.add_argument('--shift-root', nargs='+', default=[], metavar='FAMILY=PATH',
                           help='where a shift family lives (default data/<family>): '
                                f'{", ".join(SHIFT_FAMILIES)}')

    @override
    def apply_args(self, args: argparse.Namespace, options: Any) -> bool:
        """``options.shifts`` of ``--shifts``, ``options.shift_roots`` of ``--shift-root``."""
        roots = {}
        for item in args.shift_root:
            family, _, path = item.partition('=')
            if family not in SHIFT_FAMILIES or not path:
                raise UsageError(f'--shift-root takes FAMILY=PATH with FAMILY one of '
                                 f'{", ".join(SHIFT_FAMILIES)}; got {item!r}')
            roots[family] = path
        options.shifts = parse_shifts(args.shifts) if args.shifts else None
        options.shift_roots = roots
        return bool(options.shifts)

    @override
    def report_markdown(self, results_by_label: Mapping[str, Mapping], metrics: Sequence[str],
                        extras: Any) -> List[str]:
        return shift_markdown(results_by_label, metrics, extras)

    @override
    def report_files(self, results_by_label: Mapping[str, Mapping], out_dir: str,
                     metrics: Sequence[str], extras: Any) -> List[str]:
        path = write_shift_csv(results_by_label, out_dir, metrics, extras)
        return [path] if path else []

    @override
    def report_plots(self, results_by_label: Mapping[str, Mapping], out_dir: str,
                     metrics: Sequence[str], extras: Any) -> List[str]:
        return plot_shifts(results_by_label, out_dir, metrics, extras)


SHIFT = ShiftKind('shift', lambda name: name in SHIFT_SETS, own_images=True,
                  category='real-world shift', alone='shifts')
