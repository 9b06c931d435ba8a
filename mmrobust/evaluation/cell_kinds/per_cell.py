"""A kind whose cells each get a dataloader of their own: the base of the built-in kinds."""
from typing import Any, Iterator, List

from ..loop import per_cell_cells
from . import Cell, CellKind, CellRun, Inferred

__all__ = ['PerCellKind']


class PerCellKind(CellKind):
    """A kind that infers its cells one after another, each from :meth:`dataloader`.

    Its cells read :attr:`CellRun.light` (no ground-truth mask that no metric reads) unless
    ``config_ground_truth``; the model runs within :meth:`~CellKind.model_context`.
    """

    def dataloader(self, run: CellRun, cell: Cell) -> Any:
        """A cell's test dataloader config."""
        raise NotImplementedError(f'cell kind {self.name!r} has no dataloader()')

    def prefetch(self, run: CellRun) -> int:
        """Batches preprocessed ahead of the model (0 where the preprocessor needs the model)."""
        return run.prefetch

    def config(self, run: CellRun) -> Any:
        """The config its cells' dataloaders are made from."""
        return run.cfg if self.config_ground_truth else run.light

    def infer(self, run: CellRun, cells: List[Cell]) -> Iterator[Inferred]:
        """Each cell's inference with a dataloader of its own (``per_cell_cells``)."""
        return per_cell_cells(run.runner, cells, run.evaluators, run.progress_bar,
                              lambda cell: self.dataloader(run, cell),
                              lambda cell: self.model_context(run, cell),
                              same_images=not self.own_images,
                              post_process_queue=run.post_process_queue,
                              prefetch=self.prefetch(run))
