"""The real-world shift cells: another test set through the config's pipeline and metric.

A cell ``(set, level)`` of :mod:`~mmrobust.datasets.shift_sets` (ACDC, Foggy Cityscapes, Dark
Zurich, COCO-O): its images are its own (per-image statistics pair only within it), a dataloader
each, a detection set's COCO metrics scored against its annotation file; not in mPC / rPC.
"""
from typing import Any, Dict, List, Mapping, Tuple

from typing_extensions import override

from ...datasets.shift_sets import (
    SHIFT_SETS,
    check_shift_root,
    check_shift_task,
    shift_ann_file,
    shift_identity,
)
from ...utils.config_checks import leaf_datasets
from ..cells import shift_dataloader
from ..evaluator_cfg import is_coco_metric, metric_entries
from . import Cell, CellRun, RunSpec, register_cell_kind
from . import attack as _attack  # noqa: F401  (registered before: run order)
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


SHIFT = register_cell_kind(ShiftKind('shift', lambda name: name in SHIFT_SETS, own_images=True,
                                     category='real-world shift'))
