"""What a cell of a robustness evaluation is, and where its images come from.

A cell is ``(name, index)``: the clean test set ``(clean, 0)``, a corruption at a severity
``(fog, 3)``, an attack at its k-th budget ``(pgd_linf, 2)``, or the per-image worst case over
the attacks ``(worst, 2)``. This module names them (the attack families are rows of
:mod:`.attack_families`), edits a test pipeline for a cell (the image-loading step found by
type; the corruption right after it, or a stored set's path mapped before it) and builds a
cell's dataloader config. Where a cell's images come from is a :class:`CellSource`: corrupted
on the fly from ``seed`` and the channel order, or read from a stored set under
``corrupted_root`` (its layout: :func:`mmrobust.corruptions.stored.cell_folder`).
"""
import copy
import os.path as osp
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence

from mmengine.config import Config, ConfigDict

from ..corruptions.stored import cell_folder, cell_image_path
from ..datasets.shift_sets import shift_dataset
from ..utils.config_checks import leaf_datasets
from ..utils.errors import InputNotFoundError
from .attack_families import ATTACK_FAMILIES, NORMS
from .cell_kinds import CLEAN, WORST, Cell
from .evaluator_cfg import annotation_steps, find_loading_step, transform_names

__all__ = ['ATTACKS', 'CLEAN', 'NORMS', 'SEGMENTATION_ONLY', 'WORST', 'Cell', 'CellSource',
           'annotations_after_resize', 'attack_names', 'cell_dataloader', 'check_stored_leaves',
           'check_stored_paths', 'gt_at_file_scale', 'shift_dataloader']

#: the built-in attack families (``pgd_linf``, ``fgsm_l2``, ...); each is a row of
#: :data:`~.attack_families.ATTACK_FAMILIES`, where families registered later join them
ATTACKS = tuple(ATTACK_FAMILIES)
#: the built-in families defined on per-pixel class scores: segmentors only
SEGMENTATION_ONLY = tuple(f.name for f in ATTACK_FAMILIES.values() if f.segmentation_only)


def attack_names() -> List[str]:
    """Every attack cell name, ``<family>_<norm>``, of every registered family."""
    return [name for family in ATTACK_FAMILIES.values() for name in family.cell_names()]


def annotations_after_resize(pipeline: Sequence) -> bool:
    """Whether a test pipeline loads its annotations after resizing.

    mmdet's default: the ground truth stays at the file's scale for evaluation. By the transforms'
    type names.
    """
    kinds = transform_names(pipeline)
    loads = annotation_steps(pipeline)
    resizes = [i for i, k in enumerate(kinds) if 'Resize' in k]
    return bool(loads and resizes and loads[0] > resizes[0])


def gt_at_file_scale(cfg: Config) -> bool:
    """Whether a config's test pipelines load the ground truth after resizing.

    Pass it as :func:`~.attacks.attack_batch`'s ``gt_at_file_scale``.
    """
    return any(annotations_after_resize(list(d.get('pipeline', [])))
               for d in leaf_datasets(cfg.test_dataloader['dataset']))


# -- where a cell's images come from ---------------------------------------------------------------

@dataclass(frozen=True)
class CellSource:
    """The source of a corrupted cell: on the fly, or a stored set.

    Corrupted on the fly (``corrupted_root`` None: from ``seed``, ``bgr_compat`` the channel order
    imagecorruptions is fed), or read from the stored set under ``corrupted_root``.
    """
    seed: int = 0
    bgr_compat: bool = False
    corrupted_root: Optional[str] = None

    def folder(self, corruption: str, severity: int) -> str:
        """A stored cell's folder (the stored set's layout)."""
        assert self.corrupted_root is not None
        return cell_folder(self.corrupted_root, corruption, severity)

    def check_folders(self, cells: Sequence[Cell]) -> None:
        """A stored set holds a folder for each corrupted cell (else: how to write it)."""
        if self.corrupted_root is None:
            return
        for corruption, severity in cells:
            if corruption == CLEAN:
                continue
            folder = self.folder(corruption, severity)
            if not osp.isdir(folder):
                raise InputNotFoundError(
                    f'{folder} does not exist: write the corrupted set with '
                    f'`python tools/make_corrupted.py SRC {self.corrupted_root} ...` for this '
                    'protocol, or drop --corrupted-root to corrupt on the fly.')

    def insert_step(self, pipeline: List, dataset: Mapping, corruption: str,
                    severity: int) -> List:
        """``pipeline`` with the cell's step.

        A :class:`StoredCell` before the loading step (it maps the sample's path, whatever formed
        it) or a :class:`Corrupt` right after.
        """
        pipeline = list(pipeline)
        at = find_loading_step(pipeline)
        if self.corrupted_root:
            pipeline.insert(at, dict(type='StoredCell', root=self.corrupted_root,
                                     corruption=corruption, severity=severity,
                                     data_root=dataset.get('data_root')))
        else:
            pipeline.insert(at + 1, dict(type='Corrupt', corruption=corruption,
                                         severity=severity, seed=self.seed,
                                         bgr_compat=self.bgr_compat))
        return pipeline


def cell_dataloader(cfg: Config, corruption: Optional[str], severity: int, seed: int,
                    bgr_compat: bool, corrupted_root: Optional[str]) -> ConfigDict:
    """The test dataloader config of one cell (``corruption`` None or ``clean``: the clean set).

    A stored cell reads each sample's image from the stored set (a :class:`StoredCell` step
    before the loading step maps its path, whatever formed it); an on-the-fly cell corrupts it
    right after loading.
    """
    loader = copy.deepcopy(cfg.test_dataloader)
    if corruption is None or corruption == CLEAN:
        return loader
    source = CellSource(seed, bgr_compat, corrupted_root)
    source.check_folders([(corruption, severity)])
    for dataset in leaf_datasets(loader['dataset']):
        dataset['pipeline'] = source.insert_step(dataset['pipeline'], dataset, corruption,
                                                 severity)
    return loader


def shift_dataloader(cfg: Config, cell: Cell, roots: Optional[Mapping[str, str]]) -> ConfigDict:
    """The test dataloader config of a real-world shift cell.

    The config's test dataset (its pipeline and metainfo) pointed at the shift set's images and
    labels.

    Raises:
        UsageError: the test dataset is several datasets (a shift replaces one).
    """
    from ..utils.errors import UsageError
    loader = copy.deepcopy(cfg.test_dataloader)
    leaves = leaf_datasets(loader['dataset'])
    if len(leaves) != 1:
        raise UsageError(f'shift cell {cell[0]}: the test dataloader holds {len(leaves)} '
                         'datasets; a shift set replaces one test dataset')
    leaf = leaves[0]
    shifted = shift_dataset(leaf, cell[0], cell[1], roots)
    leaf.clear()
    leaf.update(shifted)
    return loader


def check_stored_paths(dataset: Any, data_root: Optional[str], corrupted_root: str,
                       cells: List[Cell]) -> None:
    """Refuse, before any inference, a stored set that cannot serve every sample of a built dataset.

    A path that has no place in the set's layout, or a cell without its first image.

    Raises:
        StoredSetError: a sample's image is not under ``data_root`` (says how to mend it).
        InputNotFoundError: a cell's folder lacks an image (the set is incomplete).
    """
    stored = [c for c in cells if c[0] != CLEAN]
    if not stored or len(dataset) == 0:
        return
    paths = [dataset.get_data_info(i)['img_path'] for i in range(len(dataset))]
    for path in paths:  # NOTE: raises on the first that cannot be placed
        cell_image_path(path, data_root, corrupted_root, *stored[0])
    for cell in stored:
        first = cell_image_path(paths[0], data_root, corrupted_root, *cell)
        if not osp.isfile(first):
            raise InputNotFoundError(
                f'{first} does not exist: the stored set {corrupted_root} lacks images of cell '
                f'{cell[0]} {cell[1]}. Rerun make_corrupted.py for this protocol into it.')


def check_stored_leaves(cfg: Config, corrupted_root: str, cells: List[Cell]) -> None:
    """:func:`check_stored_paths` for every dataset of the test dataloader (built once here)."""
    from mmengine.registry import DATASETS
    for leaf in leaf_datasets(cfg.test_dataloader['dataset']):
        leaf = copy.deepcopy(leaf)
        leaf['pipeline'] = []  # NOTE: only the sample list is read
        dataset = DATASETS.build(leaf)
        if hasattr(dataset, 'full_init'):
            dataset.full_init()
        check_stored_paths(dataset, leaf.get('data_root'), corrupted_root, cells)
