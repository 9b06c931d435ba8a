"""One dataloader for every cell of a protocol: the dataset built once, its workers kept.

:func:`one_pass_loader` builds the test dataset once (its annotations parsed once) with a
:class:`~mmrobust.datasets.transforms.CorruptCell` step right after the image-loading step, and
wraps it in :class:`CellDataset`, which serves cell ``k``'s image ``i`` at index ``k * N + i``:
the cell reaches the dataloader workers as data (``CorruptCell`` reads it; a stored set's image
path is rewritten into ``<corrupted root>/<corruption>/<severity>/``). :class:`CellBatchSampler`
gives every cell the batches the config's own sampler would give this rank, never mixing two
cells in a batch, so the workers prefetch cell k+1 while cell k's last batches are in flight.
"""
import copy
from typing import Any, Dict, Iterator, List, Optional, Sequence

from mmengine.config import Config
from mmengine.dist import get_dist_info
from torch.utils.data import Dataset, Sampler

from ...corruptions.stored import cell_image_path
from ...datasets.transforms import CELL_KEY
from ...utils.config_checks import leaf_datasets
from ...utils.progress import Progress
from ..cells import Cell, CellSource, check_stored_paths
from ..evaluator_cfg import find_loading_step
from ..loop import (
    DEFAULT_POST_PROCESS_QUEUE,
    DEFAULT_PREFETCH,
    OverlappedTestLoop,
    iterate_one_pass,
)
from . import CLEAN, Inferred

__all__ = ['CellDataset', 'CellBatchSampler', 'OnePassUnsupported', 'one_pass_cells',
           'one_pass_loader']


class OnePassUnsupported(Exception):
    """The test dataloader cannot serve every cell from one dataset.

    The loop then builds one per cell, and says why.
    """


class CellDataset(Dataset):
    """Cells x images of one built dataset.

    Index ``k * len(dataset) + i`` is image ``i`` of ``cells[k]``.

    Args:
        dataset: the built test dataset (an mmengine ``BaseDataset``).
        cells: ``(corruption, severity)`` per cell, ``(CLEAN, 0)`` for the clean set.
        corrupted_root: read corrupted cells from ``<root>/<corruption>/<severity>/`` (the layout
            of ``make_corrupted.py``) instead of corrupting on the fly.
    """

    def __init__(self, dataset, cells: Sequence[Cell],
                 corrupted_root: Optional[str] = None) -> None:
        self.dataset, self.cells, self.corrupted_root = dataset, list(cells), corrupted_root
        self.images = len(dataset)

    @property
    def metainfo(self) -> dict:
        """The wrapped dataset's metainfo."""
        return self.dataset.metainfo

    def __len__(self) -> int:
        return len(self.cells) * self.images

    def cell_path(self, cell: Cell, path: str) -> str:
        """``path`` (under the dataset's ``data_root``) in the stored set's cell folder."""
        return cell_image_path(path, self.dataset.data_root, self.corrupted_root, *cell)

    def __getitem__(self, index: int) -> dict:
        k, i = divmod(index, self.images)
        cell = self.cells[k]
        info = self.dataset.get_data_info(i)  # NOTE: a copy, as prepare_data() gets it
        if cell[0] != CLEAN:
            if self.corrupted_root:
                info['img_path'] = self.cell_path(cell, info['img_path'])
            else:
                info[CELL_KEY] = cell
        data = self.dataset.pipeline(info)
        if data is None:
            raise RuntimeError(f'the test pipeline returned None for image {i} of cell {cell}')
        return data


class CellBatchSampler(Sampler):
    """Every cell's batches in turn.

    A cell's batches are the batches of ``indices`` (what the config's sampler gives this rank),
    offset to the cell; no batch holds two cells.
    """

    def __init__(self, indices: Sequence[int], cells: int, images: int, batch_size: int,
                 drop_last: bool = False) -> None:
        self.indices, self.cells, self.images = list(indices), cells, images
        self.batch_size, self.drop_last = batch_size, drop_last
        full, rest = divmod(len(self.indices), batch_size)
        self.batches_per_cell = full + (1 if rest and not drop_last else 0)

    def __iter__(self) -> Iterator[List[int]]:
        for k in range(self.cells):
            offset = k * self.images
            for b in range(self.batches_per_cell):
                yield [offset + i for i in self.indices[b * self.batch_size:
                                                        (b + 1) * self.batch_size]]

    def __len__(self) -> int:
        return self.cells * self.batches_per_cell


def _is_plain(loader_cfg: Dict) -> Optional[str]:
    """Why one dataset cannot serve every cell (None: it can)."""
    leaves = leaf_datasets(loader_cfg['dataset'])
    if len(leaves) != 1 or leaves[0] is not loader_cfg['dataset']:
        return 'the test dataset is a wrapper of several datasets'
    if loader_cfg.get('batch_sampler'):
        return 'the test dataloader has its own batch_sampler'
    return None


def one_pass_loader(runner, cfg: Config, cells: Sequence[Cell], seed: int, bgr_compat: bool,
                    corrupted_root: Optional[str]):
    """A dataloader over every cell in ``cells`` (in order), and its batches per cell.

    Raises:
        OnePassUnsupported: the config's dataset or loader cannot be shared by the cells.
        FileNotFoundError: a stored cell's folder or images are missing (says how to write
            them).
        StoredSetError: a sample's image has no place in the stored set's layout.
    """
    from mmengine.dataset import BaseDataset
    from mmengine.registry import DATA_SAMPLERS, DATASETS
    loader_cfg = copy.deepcopy(cfg.test_dataloader)
    why = _is_plain(loader_cfg)
    if why:
        raise OnePassUnsupported(why)
    dataset_cfg = loader_cfg.pop('dataset')
    if corrupted_root:
        CellSource(seed, bgr_compat, corrupted_root).check_folders(cells)
    else:
        pipeline = list(dataset_cfg['pipeline'])
        at = find_loading_step(pipeline)
        pipeline.insert(at + 1, dict(type='CorruptCell', seed=seed, bgr_compat=bgr_compat))
        dataset_cfg['pipeline'] = pipeline
    dataset = DATASETS.build(dataset_cfg)
    if hasattr(dataset, 'full_init'):
        dataset.full_init()
    if not isinstance(dataset, BaseDataset) or (
            type(dataset).prepare_data is not BaseDataset.prepare_data):
        raise OnePassUnsupported(f'{type(dataset).__name__} prepares its samples its own way')
    if corrupted_root:  # NOTE: here, not in a dataloader worker after the clean cell's inference
        check_stored_paths(dataset, dataset.data_root, corrupted_root, list(cells))
    # NOTE: the rank's indices of the config's own sampler, as each per-cell loader had them
    sampler = DATA_SAMPLERS.build(loader_cfg.pop('sampler'),
                                  default_args=dict(dataset=dataset, seed=runner.seed))
    batches = CellBatchSampler(list(iter(sampler)), len(cells), len(dataset),
                               loader_cfg.pop('batch_size'), loader_cfg.pop('drop_last', False))
    loader_cfg.update(dataset=CellDataset(dataset, cells, corrupted_root), sampler=None,
                      batch_sampler=batches)
    loader_cfg.pop('persistent_workers', None)  # NOTE: one pass: the workers live through it
    diff_rank_seed = runner._randomness_cfg.get('diff_rank_seed', False)
    loader = runner.build_dataloader(loader_cfg, seed=runner.seed, diff_rank_seed=diff_rank_seed)
    return loader, batches.batches_per_cell


def one_pass_cells(runner, cfg: Config, cells: List[Cell], evaluator_cfg: Any,
                   seed: int, bgr_compat: bool, corrupted_root: Optional[str],
                   progress_bar: Progress, post_process_queue: int = DEFAULT_POST_PROCESS_QUEUE,
                   prefetch: int = DEFAULT_PREFETCH) -> Iterator[Inferred]:
    """Every cell's inference from one dataloader, the evaluator built once.

    Yields as :func:`~..loop.per_cell_cells`. Raises ``OnePassUnsupported`` before
    any inference.
    """
    loader, per_cell = one_pass_loader(runner, cfg, cells, seed, bgr_compat, corrupted_root)
    images = loader.dataset.images
    _, world = get_dist_info()
    loop = OverlappedTestLoop(runner, loader, evaluator_cfg,
                              post_process_queue=post_process_queue, prefetch=prefetch)
    loop.as_runner_test_loop()
    progress_bar.set_total(images * len(cells))
    return iterate_one_pass(runner, loop, cells, per_cell, images, world, progress_bar)
