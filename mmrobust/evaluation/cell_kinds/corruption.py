"""The clean cell and the corruption cells: on the fly or from a stored set, in one pass.

The clean set ``(clean, 0)`` rides with the corruption cells (:attr:`CellKind.inferred_by`): one
dataloader serves them all where it can (:mod:`.one_pass`, the optimisation this kind offers),
else each builds its own. Only the corruption cells count in mPC.
"""
import dataclasses
from typing import Any, Dict, Iterator, List, Mapping, Tuple

from mmengine.logging import print_log
from typing_extensions import override

from ...corruptions.protocols import CORRUPTIONS
from ...corruptions.stored import (
    MANIFEST,
    cell_folder,
    read_stored_set,
    stored_content_identity,
    stored_set_identity,
    stored_settings,
)
from ...utils.config_checks import leaf_datasets
from ..cells import cell_dataloader, check_stored_leaves
from ..evaluator_cfg import find_loading_step
from . import CLEAN, Cell, CellRun, Inferred, RunSpec
from .one_pass import OnePassUnsupported, one_pass_cells
from .per_cell import PerCellKind

__all__ = ['CLEAN_SET', 'CORRUPTION', 'CorruptionKind']


class CorruptionKind(PerCellKind):
    """Cells of corrupted test images (and the clean cell, their severity 0)."""

    @override
    def planned(self, identity: Mapping) -> List[Cell]:
        return [(c, int(s)) for c, sevs in identity['cells_planned'].items() for s in sevs]

    @override
    def identity(self, spec: RunSpec) -> Dict[str, Any]:
        stored = spec.stored_set
        if spec.corrupted_root and stored == stored_set_identity(None):
            # NOTE: a set without a manifest is its content (paths and sizes of the cells
            # read), so that a rerun on another set is evaluated, not relabelled; rank 0
            # alone makes the identity: a stat per file, once
            stored = stored_content_identity(spec.corrupted_root, self.planned(
                {'cells_planned': spec.protocol.severities}))
        return {'protocol': spec.protocol.name,
                'cells_planned': {c: list(s) for c, s in spec.protocol.severities.items()},
                'seed': spec.seed, 'bgr_compat': spec.bgr_compat,
                'source': 'stored' if spec.corrupted_root else 'on-the-fly',
                'stored_set': dict(stored) if stored is not None else None,
                'corrupted_root': spec.corrupted_root}

    def check(self, spec: RunSpec) -> RunSpec:
        """A stored set's manifest read: its seed and colour order become the run's."""
        root = spec.corrupted_root
        if root is None:
            return spec
        manifest = read_stored_set(root)
        seed, bgr_compat = stored_settings(root, manifest, spec.seed, spec.bgr_compat)
        if manifest is None:
            print_log(f'{root} has no {MANIFEST} (not written by make_corrupted.py): how its '
                      'cells were made is unknown; the results record that (stored_set) and '
                      f'the seed / colour mode given ({seed}, bgr_compat={bgr_compat})',
                      logger='current', level=30)
        return dataclasses.replace(spec, seed=seed, bgr_compat=bgr_compat,
                                   stored_set=stored_set_identity(manifest))

    @override
    def check_run(self, runner: Any, cfg: Any, spec: RunSpec) -> None:
        for dataset in leaf_datasets(cfg.test_dataloader['dataset']):
            find_loading_step(list(dataset['pipeline']))  # NOTE: raises PipelineError

    def category_of(self, name: str) -> str:
        """The corruption's category (noise, blur, weather, digital)."""
        return CORRUPTIONS[name].category

    def image_roots(self, cfg: Any, cell: Cell, spec: RunSpec) -> Tuple[str, ...]:
        """The stored set's folder of ``cell``, then the datasets' data roots."""
        stored = (cell_folder(spec.corrupted_root, *cell), ) if spec.corrupted_root else ()
        return stored + super().image_roots(cfg, cell, spec)

    @override
    def dataloader(self, run: CellRun, cell: Cell) -> Any:
        return cell_dataloader(self.config(run), cell[0], cell[1], run.spec.seed,
                               run.spec.bgr_compat, run.spec.corrupted_root)

    def infer(self, run: CellRun, cells: List[Cell]) -> Iterator[Inferred]:
        """One dataloader for every cell where it can serve them all, else one per cell.

        Records how in ``run.loading['loader']``.
        """
        spec = run.spec
        if run.writes_files:
            run.loading['loader'] = f'per-cell ({run.writes_files})'
        elif not run.one_pass:
            run.loading['loader'] = 'per-cell (asked for)'
        else:
            try:
                inference = one_pass_cells(run.runner, self.config(run), cells,
                                           run.evaluators(cells[0])[0], spec.seed,
                                           spec.bgr_compat, spec.corrupted_root,
                                           run.progress_bar, run.post_process_queue,
                                           run.prefetch)
                run.loading['loader'] = 'one-pass'
                return inference
            except OnePassUnsupported as err:
                run.loading['loader'] = f'per-cell ({err})'
                print_log(f'one dataloader cannot serve every cell ({err}): each cell builds '
                          'its own', logger='current', level=30)
        if spec.corrupted_root:  # NOTE: every sample's stored path, before the first inference
            check_stored_leaves(self.config(run), spec.corrupted_root, cells)
        return super().infer(run, cells)


class CleanKind(CorruptionKind):
    """The clean test set, ``(clean, 0)``: inferred with the corruption cells, not in mPC."""

    @override
    def planned(self, identity: Mapping) -> List[Cell]:
        return [(CLEAN, 0)]

    @override
    def identity(self, spec: RunSpec) -> Dict[str, Any]:
        return {}

    @override
    def check(self, spec: RunSpec) -> RunSpec:
        return spec

    @override
    def check_run(self, runner: Any, cfg: Any, spec: RunSpec) -> None:
        pass  # NOTE: the corruption kind checks the pipeline both read, once

    @override
    def label(self, cell: Cell) -> str:
        return CLEAN

    @override
    def category_of(self, name: str) -> str:
        return ''


CLEAN_SET = CleanKind('clean', lambda name: name == CLEAN, inferred_by='corruption')
CORRUPTION = CorruptionKind('corruption', lambda name: name in CORRUPTIONS, counts_in_mpc=True)
