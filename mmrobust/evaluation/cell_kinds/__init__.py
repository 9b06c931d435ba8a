"""The kinds of cell a robustness evaluation has, each one object: clean, corruption, attack, shift.

A kind owns the names of its cells (each name is exactly one kind's) and everything the run does
with them that differs by kind: which cells it plans and what the results identity records of
them, its pre-flight checks, its dataloader, its model context (the attack's preprocessor), its
evaluator config, its image roots, whether mPC averages over it, its command-line options, what
it does once every cell is recorded (the attack kind's worst case) and what a report says of it
(each cell's category, the kind's own section, CSV file and plots). The kinds are registered in
run order; :func:`kind_of` answers for a name. A name no kind owns is an error, not a
corruption: a new kind registers itself here (CONTRIBUTING.md, recipes; from a module the
config's ``custom_imports`` names, for the tools) instead of being counted in mPC by default.

This module is the registry and the base class, and imports nothing of the run; the built-in
kinds (:mod:`.corruption`, :mod:`.attack`, :mod:`.shift`) build on the run's machinery and are
registered, in run order, by the one list of :mod:`.builtin` when :mod:`mmrobust.evaluation` is
imported.
"""
import argparse
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

from ...utils.config_checks import leaf_datasets
from ...utils.errors import MMRobustError
from ...utils.tables import RowTable

__all__ = ['CELL_KINDS', 'CLEAN', 'WORST', 'Cell', 'CellKind', 'CellRun', 'Inferred', 'RunSpec',
           'UnknownCellError', 'counts_in_mpc', 'kind_of', 'register_cell_kind']

#: the clean test set's cell name (severity 0)
CLEAN = 'clean'
#: the per-image worst case over a run's attacks (:mod:`..worst_case`)
WORST = 'worst'
#: a cell: (its name, its severity, budget index or level)
Cell = Tuple[str, int]
#: what a kind's inference yields per cell: (cell, gathered results or None, the loop's
#: metrics, dataset_meta, timing), for rank 0's metric queue
Inferred = Tuple[Cell, Any, List[Any], Any, Dict[str, float]]


class UnknownCellError(MMRobustError, ValueError):
    """A cell name that no registered kind owns (or that two kinds claim)."""


@dataclass(frozen=True)
class RunSpec:
    """What a robustness run evaluates, checked once before any model is built.

    ``tools/test_robustness.py`` and :func:`~..robustness.evaluate_robustness` share it
    (:meth:`~..robustness.RobustnessOptions.validated`): each kind's :meth:`CellKind.check`
    runs once per run.

    Attributes:
        protocol: the corruption protocol (:class:`~mmrobust.corruptions.Protocol`).
        seed, bgr_compat: of the corruptions (a stored set's own, from its manifest).
        corrupted_root: the stored corrupted set read instead of corrupting on the fly.
        stored_set: its provenance (:func:`~mmrobust.corruptions.stored.stored_set_identity`),
            None on the fly or when the set has no manifest.
        attacks: the attack cells (:func:`~..attacks.attack_plan`).
        shifts: the real-world shift cells ``(set, level)``.
        shift_roots: ``{family: root}`` of the shift sets.
        kind_options: the options of kinds registered besides the built-in ones, by kind name
            (each kind reads its own in :meth:`CellKind.identity` and its dataloader).
    """
    protocol: Any
    seed: int = 0
    bgr_compat: bool = False
    corrupted_root: Optional[str] = None
    stored_set: Optional[Mapping] = None
    attacks: Optional[Mapping[str, Dict]] = None
    shifts: Optional[Tuple[Cell, ...]] = None
    shift_roots: Optional[Mapping[str, str]] = None
    kind_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class CellRun:
    """What a kind's inference works with, for one run.

    Attributes:
        runner: the runner, its model built and its checkpoint loaded.
        cfg: the config; ``light``: the config whose test pipeline decodes no ground-truth
            mask that no metric reads (:func:`~..cell_evaluators.without_unread_gt_masks`).
        spec: the run's :class:`RunSpec`.
        evaluators: a cell's evaluator config (:class:`~..cell_evaluators.CellEvaluators`).
        progress_bar: the run's :class:`~mmrobust.utils.progress.Progress`.
        post_process_queue, prefetch: of :class:`~..loop.OverlappedTestLoop`.
        one_pass: one dataloader for every cell where a kind offers it.
        writes_files: why every cell needs its own evaluator (a metric writes files), or None.
        loading: how the cells were loaded, recorded in the results (a kind adds to it).
    """
    runner: Any
    cfg: Any
    light: Any
    spec: RunSpec
    evaluators: Callable[[Cell], Tuple[Any, List[Dict]]]
    progress_bar: Any
    post_process_queue: int
    prefetch: int
    one_pass: bool = True
    writes_files: Optional[str] = None
    loading: Dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CellKind:
    """One kind of cell; a subclass overrides what its cells need (the base plans none).

    Args:
        name: the kind's name (``corruption``).
        owns: whether a cell name is one of this kind's.
        counts_in_mpc: mPC averages over its cells (the corruptions only).
        own_images: its cells are another image set than the clean test set's.
        inferred_by: the kind whose :meth:`infer` takes this kind's cells with its own (the
            clean cell rides with the corruptions, in their one pass); None: this kind's.
        config_ground_truth: its inference reads the ground truth the config's own pipeline
            loads (an attack's loss), not only what the metrics read.
        category: what a report's category column says of its cells
            (:meth:`category_of`).
        alone: the protocol name of a run that asks for this kind's cells only (``attacks``);
            None: the kind's name.
    """

    name: str
    owns: Callable[[str], bool]
    counts_in_mpc: bool = False
    own_images: bool = False
    inferred_by: Optional[str] = None
    config_ground_truth: bool = False
    category: str = ''
    alone: Optional[str] = None

    def planned(self, identity: Mapping) -> List[Cell]:
        """This kind's cells of a results identity, in run order."""
        return []

    def identity(self, spec: RunSpec) -> Dict[str, Any]:
        """What the results identity records of this kind's cells."""
        return {}

    def check(self, spec: RunSpec) -> RunSpec:
        """Pre-flight, before any model is built; returns the spec (a kind may resolve it)."""
        return spec

    def check_run(self, runner: Any, cfg: Any, spec: RunSpec) -> None:
        """Pre-flight with the config and the model, before any inference."""

    def label(self, cell: Cell) -> str:
        """``fog 3``: a cell as the log and the progress bar name it."""
        return f'{cell[0]} {cell[1]}'

    def evaluator(self, evaluator_cfg: Any, cell: Cell, spec: RunSpec) -> Any:
        """A cell's evaluator config, from the run's (a copy, edited in place)."""
        return evaluator_cfg

    def image_roots(self, cfg: Any, cell: Cell, spec: RunSpec) -> Tuple[str, ...]:
        """Folders under which an image's relative path is the same in every cell.

        The per-image statistics name images by it. The test datasets' data roots.
        """
        return tuple(str(d['data_root']) for d in leaf_datasets(cfg.test_dataloader['dataset'])
                     if d.get('data_root'))

    def model_context(self, run: CellRun, cell: Cell) -> ContextManager:
        """What the model runs within for ``cell`` (an attack's preprocessor)."""
        return nullcontext()

    def infer(self, run: CellRun, cells: List[Cell]) -> Iterator[Inferred]:
        """Every one of ``cells``' inference, cell by cell."""
        raise NotImplementedError(
            f'cell kind {self.name!r} plans cells but has no inference: subclass '
            'mmrobust.evaluation.cell_kinds.per_cell.PerCellKind (a dataloader per cell) and '
            'give it dataloader() (CONTRIBUTING.md, recipes)')

    # -- the tools ---------------------------------------------------------------------------

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """This kind's options of ``tools/test_robustness.py`` (none here)."""

    def options_from_args(self, args: argparse.Namespace) -> Any:
        """This kind's ``kind_options`` from the parsed command line; None: not asked for."""
        return None

    def apply_args(self, args: argparse.Namespace, options: Any) -> bool:
        """Set this kind's part of the run's options from the command line.

        The base puts :meth:`options_from_args` into ``options.kind_options[<name>]`` (a
        :class:`~..robustness.RobustnessOptions`), where the config's ``robustness_kind_options``
        may have put them already.

        Returns:
            Whether this kind's cells were asked for (a kind asked for alone replaces the default
            corruption protocol).
        """
        value = self.options_from_args(args)
        if value is not None:
            options.kind_options = {**(options.kind_options or {}), self.name: value}
        return self.name in (options.kind_options or {})

    # -- the results, once every cell is recorded -------------------------------------------

    def finish(self, path: str, data: Dict, stats_folders: Optional[Any] = None
               ) -> Dict[str, str]:
        """Cells computed from the recorded ones, added to ``data`` (the worst case over attacks).

        Args:
            path: the results file (its per-image statistics lie beside it).
            data: the results dict, edited in place.
            stats_folders: the per-image folders to read (a merge's shards); None: ``path``'s.

        Returns:
            ``{what: why}`` of what could not be computed (logged by the caller).
        """
        return {}

    # -- the report --------------------------------------------------------------------------

    def category_of(self, name: str) -> str:
        """What a report's category column says of cell ``name`` (:attr:`category`)."""
        return self.category

    def report_markdown(self, results_by_label: Mapping[str, Mapping], metrics: Sequence[str],
                        extras: Any) -> List[str]:
        """This kind's section of the report's Markdown (none here)."""
        return []

    def report_files(self, results_by_label: Mapping[str, Mapping], out_dir: str,
                     metrics: Sequence[str], extras: Any) -> List[str]:
        """This kind's CSV files in ``out_dir``, their paths (none here)."""
        return []

    def report_plots(self, results_by_label: Mapping[str, Mapping], out_dir: str,
                     metrics: Sequence[str], extras: Any) -> List[str]:
        """This kind's plots in ``out_dir``, their paths (none here)."""
        return []


#: the kinds by name, in run order
CELL_KINDS: Dict[str, CellKind] = RowTable('cell kind')


def register_cell_kind(kind: CellKind, force: bool = False) -> CellKind:
    """Add ``kind`` to :data:`CELL_KINDS`, after those registered before it."""
    return CELL_KINDS.add(kind, force)


def kind_of(name: str) -> CellKind:
    """The kind a cell name is of.

    Raises:
        UnknownCellError: no kind, or more than one, owns ``name``.
    """
    owners = [k for k in CELL_KINDS.values() if k.owns(name)]
    if len(owners) != 1:
        raise UnknownCellError(
            f'cell {name!r} is {"no" if not owners else "more than one"} kind\'s '
            f'({", ".join(k.name for k in owners) or ", ".join(CELL_KINDS)}): a results file '
            'of a corruption, attack or shift set that this mmrobust does not know. Register '
            'what makes it (a corruption, an attack family, a shift set, a cell kind) before '
            'reading it: name its module in the config\'s custom_imports (the tools import the '
            'modules a results file records)')
    return owners[0]


def counts_in_mpc(name: str) -> bool:
    """Whether mPC averages over the cells of ``name``."""
    return kind_of(name).counts_in_mpc
