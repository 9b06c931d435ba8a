"""Real-world distribution shift sets, in their published layouts, as cells of a robustness run.

A *shift cell* ``(name, level)`` is the config's own test pipeline and metric on another dataset
root: ACDC's four adverse conditions, Foggy Cityscapes at three fog densities and Dark Zurich
for a Cityscapes-trained segmentor (the 19 Cityscapes train ids); COCO-O's six domains for a
COCO-trained detector (COCO's 80 categories). Nothing is downloaded: each family reads a local
root (``data/<family>`` by default, ``--shift-root FAMILY=PATH``), checked before any inference
against the layout its devkit or paper repository defines.

==================  =====================================================================
family              layout under its root (the published one)
==================  =====================================================================
acdc                ``rgb_anon/<condition>/val/<seq>/*_rgb_anon.png`` and
                    ``gt/<condition>/val/<seq>/*_gt_labelTrainIds.png``
foggy_cityscapes    ``leftImg8bit_foggy/val/<city>/*_leftImg8bit_foggy_beta_<beta>.png`` beside
                    Cityscapes' ``gtFine/val/<city>/*_gtFine_labelTrainIds.png``
dark_zurich         ``rgb_anon/val/night/<seq>/*_rgb_anon.png`` and
                    ``gt/val/night/<seq>/*_gt_labelTrainIds.png``
coco_o              ``<domain>/val2017/*.jpg`` and ``<domain>/annotations/instances_val2017.json``
==================  =====================================================================

Splits: these are the sets' public validation splits, which is what a local run can score. They
are not what most published tables report: ACDC's and Dark Zurich's tables are of their test
splits, scored by the sets' servers (Dark Zurich val has 50 images, ACDC val about 100 per
condition), and many Foggy Cityscapes results use its refined subset (the images of the
``foggy_trainval_refined_filenames.txt`` list), not the full val split read here. Compare with
published numbers only where the split is the same. The report adds COCO-O's headline (the mean
AP over its six domains) and ACDC's mean over its four conditions (:data:`SHIFT_MEANS`).
"""
import copy
import glob
import os.path as osp
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..utils.errors import InputNotFoundError, UsageError
from ..utils.tables import RowTable

__all__ = ['SHIFT_FAMILIES', 'SHIFT_SETS', 'SHIFT_BUNDLES', 'SHIFT_MEANS', 'ShiftFamily',
           'ShiftSet', 'ShiftDatasetError', 'UnknownShiftError', 'check_shift_root',
           'check_shift_task', 'is_shift_cell', 'parse_shifts', 'register_shift_family',
           'register_shift_set', 'shift_ann_file', 'shift_dataset', 'shift_identity', 'shift_label']


class UnknownShiftError(UsageError):
    """A shift name that is not one of :data:`SHIFT_SETS` or :data:`SHIFT_BUNDLES`."""


class ShiftDatasetError(InputNotFoundError):
    """A shift set's root is missing or not laid out as the set publishes it."""


TASKS = ('segmentation', 'detection')


@dataclass(frozen=True)
class ShiftFamily:
    """A dataset a shift set comes from: its task, layout, source and licence."""
    name: str
    task: str  # 'segmentation' (Cityscapes train ids) or 'detection' (COCO categories)
    layout: str  # the expected tree, for errors and docs
    source: str  # where a user downloads it
    licence: str
    default_root: str

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f'shift family {self.name!r}: task is one of {TASKS}, not '
                             f'{self.task!r}')


@dataclass(frozen=True)
class ShiftSet:
    """One named shift: a family and, per level, the dataset arguments that select it."""
    name: str
    family: str
    levels: Dict[int, str]  # level -> what it is (shown in reports)
    # level -> arguments of the config's test dataset (relative to the family's root)
    dataset: Dict[int, Dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.levels or set(self.dataset) != set(self.levels):
            raise ValueError(f'shift set {self.name!r}: each of its levels needs its dataset '
                             f'arguments (levels {sorted(self.levels)}, dataset '
                             f'{sorted(self.dataset)})')
        if ':' in self.name:
            raise ValueError(f'shift set {self.name!r}: no ":" in a name (NAME:LEVEL)')


#: the families by name, in registration order
SHIFT_FAMILIES: Dict[str, ShiftFamily] = RowTable('shift family')
#: the sets by name, in registration order (the tool's and the report's)
SHIFT_SETS: Dict[str, ShiftSet] = RowTable('shift set')


def register_shift_family(family: ShiftFamily, force: bool = False) -> ShiftFamily:
    """Add ``family`` to :data:`SHIFT_FAMILIES` (``force``: replace one of its name)."""
    return SHIFT_FAMILIES.add(family, force)


def register_shift_set(shift: ShiftSet, force: bool = False) -> ShiftSet:
    """Add ``shift`` to :data:`SHIFT_SETS`; its family must be registered first."""
    if shift.family not in SHIFT_FAMILIES:
        raise ValueError(f'shift set {shift.name!r}: family {shift.family!r} is not registered '
                         f'({", ".join(SHIFT_FAMILIES)}); register_shift_family first')
    return SHIFT_SETS.add(shift, force)


_CITY_GT = '_gt_labelTrainIds.png'
for _family in (
    ShiftFamily('acdc', 'segmentation',
                'rgb_anon/{fog,night,rain,snow}/val/<sequence>/<name>_rgb_anon.png and '
                'gt/{fog,night,rain,snow}/val/<sequence>/<name>_gt_labelTrainIds.png',
                'https://acdc.vision.ee.ethz.ch (rgb_anon_trainvaltest.zip, '
                'gt_trainval.zip)', 'ACDC licence: non-commercial research use',
                'data/acdc'),
    ShiftFamily('foggy_cityscapes', 'segmentation',
                'leftImg8bit_foggy/val/<city>/<name>_leftImg8bit_foggy_beta_{0.005,0.01,0.02}'
                '.png beside Cityscapes\' gtFine/val/<city>/<name>_gtFine_labelTrainIds.png '
                '(unpack leftImg8bit_trainvaltest_foggy.zip into the Cityscapes root)',
                'https://www.cityscapes-dataset.com (leftImg8bit_trainvaltest_foggy.zip; the '
                'labels are Cityscapes\' gtFine, *_labelTrainIds.png made by cityscapesscripts)',
                'Cityscapes licence: non-commercial research use', 'data/cityscapes'),
    ShiftFamily('dark_zurich', 'segmentation',
                'rgb_anon/val/night/<sequence>/<name>_rgb_anon.png and '
                'gt/val/night/<sequence>/<name>_gt_labelTrainIds.png',
                'https://www.trace.ethz.ch/publications/2019/GCMA_UIoU (Dark_Zurich_val_anon'
                '.zip)', 'Dark Zurich licence: non-commercial research use', 'data/dark_zurich'),
    ShiftFamily('coco_o', 'detection',
                '{sketch,weather,cartoon,painting,tattoo,handmake}/val2017/*.jpg and '
                '<domain>/annotations/instances_val2017.json (COCO category ids)',
                'https://github.com/alibaba/easyrobust/tree/main/benchmarks/coco_o (the '
                'ood_coco folder)', 'COCO-O: research use; its images keep their own licences',
                'data/coco_o'),
):
    register_shift_family(_family)

ACDC_CONDITIONS = ('fog', 'night', 'rain', 'snow')
FOGGY_BETAS = {1: '0.005', 2: '0.01', 3: '0.02'}
COCO_O_DOMAINS = ('sketch', 'weather', 'cartoon', 'painting', 'tattoo', 'handmake')


def _seg(img_path: str, seg_map_path: str, img_suffix: str, seg_map_suffix: str) -> Dict:
    return dict(data_prefix=dict(img_path=img_path, seg_map_path=seg_map_path),
                img_suffix=img_suffix, seg_map_suffix=seg_map_suffix)


for _set in (
    *(ShiftSet(f'acdc_{c}', 'acdc', {1: f'ACDC {c}, val'}, {1: _seg(
        f'rgb_anon/{c}/val', f'gt/{c}/val', '_rgb_anon.png', _CITY_GT)})
      for c in ACDC_CONDITIONS),
    ShiftSet('foggy_cityscapes', 'foggy_cityscapes',
             {k: f'Foggy Cityscapes beta {b}, val' for k, b in FOGGY_BETAS.items()},
             {k: _seg('leftImg8bit_foggy/val', 'gtFine/val',
                      f'_leftImg8bit_foggy_beta_{b}.png', '_gtFine_labelTrainIds.png')
              for k, b in FOGGY_BETAS.items()}),
    ShiftSet('dark_zurich', 'dark_zurich', {1: 'Dark Zurich night, val'}, {1: _seg(
        'rgb_anon/val/night', 'gt/val/night', '_rgb_anon.png', _CITY_GT)}),
    *(ShiftSet(f'coco_o_{d}', 'coco_o', {1: f'COCO-O {d}'}, {1: dict(
        data_root=d, ann_file='annotations/instances_val2017.json',
        data_prefix=dict(img='val2017/'))}) for d in COCO_O_DOMAINS),
):
    register_shift_set(_set)
#: Named bundles (``--shifts cityscapes_real_world``): what papers report together.
SHIFT_BUNDLES: Dict[str, Tuple[Tuple[str, int], ...]] = {
    'cityscapes_real_world': (*((f'acdc_{c}', 1) for c in ACDC_CONDITIONS),
                              *(('foggy_cityscapes', k) for k in FOGGY_BETAS),
                              ('dark_zurich', 1)),
    'coco_o': tuple((f'coco_o_{d}', 1) for d in COCO_O_DOMAINS),
}
#: The means papers report over a family's sets, as report rows of their own (each drawn from its
#: sets' cells; a row only when every one of them is there): COCO-O's headline is the mean AP over
#: its six domains, ACDC's tables the mean over its four conditions.
SHIFT_MEANS: Dict[str, Tuple[str, Tuple[Tuple[str, int], ...]]] = {
    'coco_o_mean': ('COCO-O, mean over its 6 domains (its headline)', SHIFT_BUNDLES['coco_o']),
    'acdc_mean': ('ACDC val, mean over its 4 conditions',
                  tuple((f'acdc_{c}', 1) for c in ACDC_CONDITIONS)),
}
_ALIASES = {f'foggy_{b}': ('foggy_cityscapes', k) for k, b in FOGGY_BETAS.items()}


def is_shift_cell(name: str) -> bool:
    """Whether a results cell is a real-world shift's (not a corruption's or an attack's)."""
    return name in SHIFT_SETS


def shift_label(name: str, level: int) -> str:
    """What a shift cell is, for tables and plots (``Foggy Cityscapes beta 0.02, val``)."""
    return SHIFT_SETS[name].levels.get(int(level), f'{name} {level}')


def parse_shifts(names: Sequence[str]) -> List[Tuple[str, int]]:
    """Shift cells of ``--shifts`` items.

    A bundle, a set (all its levels), ``NAME:LEVEL`` or an alias (``foggy_0.02``), in order, without
    repeats.

    Raises:
        UnknownShiftError: an item names none of them (the message lists what there is).
    """
    cells: List[Tuple[str, int]] = []
    for item in names:
        if item in SHIFT_BUNDLES:
            found = list(SHIFT_BUNDLES[item])
        elif item in _ALIASES:
            found = [_ALIASES[item]]
        elif item in SHIFT_SETS:
            found = [(item, k) for k in SHIFT_SETS[item].levels]
        elif ':' in item and item.split(':')[0] in SHIFT_SETS:
            name, level = item.split(':', 1)
            if not level.isdigit() or int(level) not in SHIFT_SETS[name].levels:
                raise UnknownShiftError(f'{name} has levels {sorted(SHIFT_SETS[name].levels)}, '
                                        f'not {level!r}')
            found = [(name, int(level))]
        else:
            raise UnknownShiftError(
                f'unknown shift {item!r}; choose sets ({", ".join(SHIFT_SETS)}), NAME:LEVEL, '
                f'{", ".join(_ALIASES)} or bundles ({", ".join(SHIFT_BUNDLES)})')
        cells += [c for c in found if c not in cells]
    return cells


def _root(family: str, roots: Optional[Mapping[str, str]]) -> str:
    return (roots or {}).get(family) or SHIFT_FAMILIES[family].default_root


def shift_identity(cells: Sequence[Tuple[str, int]]) -> Dict[str, Dict]:
    """What a results file records of its shift cells (compared on resume and merge).

    The sets, their levels and what each level is; not the roots (moving data keeps the results).
    """
    out: Dict[str, Dict] = {}
    for name, level in cells:
        entry = out.setdefault(name, {'family': SHIFT_SETS[name].family, 'levels': {}})
        entry['levels'][str(level)] = shift_label(name, level)
    return out


def shift_dataset(dataset_cfg: Mapping, name: str, level: int,
                  roots: Optional[Mapping[str, str]] = None) -> Dict:
    """The config's test dataset pointed at a shift cell's images and labels.

    Its type, pipeline, metainfo and other arguments are kept.
    """
    shift = SHIFT_SETS[name]
    root = _root(shift.family, roots)
    dataset = copy.deepcopy(dict(dataset_cfg))
    args = copy.deepcopy(shift.dataset[int(level)])
    sub = args.pop('data_root', None)
    dataset['data_root'] = osp.join(root, sub) if sub else root
    dataset.update(args)
    return dataset


def shift_ann_file(name: str, level: int, roots: Optional[Mapping[str, str]] = None
                   ) -> Optional[str]:
    """A detection shift cell's annotation file (what its COCO metric scores against)."""
    dataset = shift_dataset({}, name, level, roots)
    ann = dataset.get('ann_file')
    return osp.join(dataset['data_root'], ann) if ann else None


def _layout_error(name: str, level: int, root: str, what: str) -> ShiftDatasetError:
    family = SHIFT_FAMILIES[SHIFT_SETS[name].family]
    return ShiftDatasetError(
        f'shift {name} {level} ({shift_label(name, level)}): {what}. Expected under {root}: '
        f'{family.layout}. Get it from {family.source} ({family.licence}); point the run at '
        f'your copy with --shift-root {family.name}=PATH (default {family.default_root}).')


def check_shift_task(name: str, task: str) -> None:
    """Check that a shift set is for the config's task (``detection`` or ``segmentation``).

    Raises:
        UsageError: it is for the other task.
    """
    family = SHIFT_FAMILIES[SHIFT_SETS[name].family]
    if task != family.task:
        raise UsageError(f'shift {name} is a {family.task} set (labels of '
                         f'{"Cityscapes" if family.task == "segmentation" else "COCO"}); the '
                         f'config is a {task} one')


def check_shift_root(name: str, level: int, roots: Optional[Mapping[str, str]] = None,
                     task: Optional[str] = None) -> None:
    """Check that a shift cell's root holds its published layout.

    That is its image folder with at least one image of its suffix and that image's label; else
    the error names the layout and its source.

    Raises:
        ShiftDatasetError: the root, a folder, an image or its label is missing.
        UsageError: the set is for another task than the config's (``task``).
    """
    shift = SHIFT_SETS[name]
    family = SHIFT_FAMILIES[shift.family]
    if task is not None:
        check_shift_task(name, task)
    root = _root(shift.family, roots)
    if not osp.isdir(root):
        raise _layout_error(name, level, root, f'{root} does not exist')
    dataset = shift_dataset({}, name, level, roots)
    prefix = dataset['data_prefix']
    if family.task == 'detection':
        images = osp.join(dataset['data_root'], prefix['img'])
        ann = osp.join(dataset['data_root'], dataset['ann_file'])
        if not osp.isdir(images) or not glob.glob(osp.join(images, '*')):
            raise _layout_error(name, level, root, f'no images in {images}')
        if not osp.isfile(ann):
            raise _layout_error(name, level, root, f'{ann} does not exist')
        return
    images = osp.join(dataset['data_root'], prefix['img_path'])
    labels = osp.join(dataset['data_root'], prefix['seg_map_path'])
    found = sorted(glob.glob(osp.join(images, '**', f'*{dataset["img_suffix"]}'), recursive=True))
    if not found:
        raise _layout_error(name, level, root,
                            f'no *{dataset["img_suffix"]} image under {images}')
    rel = osp.relpath(found[0], images)[:-len(dataset['img_suffix'])]
    label = osp.join(labels, rel + dataset['seg_map_suffix'])
    if not osp.isfile(label):
        raise _layout_error(name, level, root, f'{found[0]} has no label {label}')
