"""The model zoo: every metafile entry, its numbers, and the check of results.

Every ``configs/<folder>/metafile.yml`` entry (OpenMMLab's metafile format) with its parameters,
FLOPs and the papers' published numbers; a robustness results file is checked against the
published target of its config.

Published numbers are the papers' (``Results``), never reproduced here; a metric's name says
what it is (``box AP``: COCO-style AP@[.5:.95] x 100 on the clean set; ``box mPC`` /
``box rPC``: mean over a protocol's corruption cells and its ratio to the clean score, in %;
``mIoU`` / ``mIoU mPC`` / ``mIoU rPC`` likewise for segmentation). The protocol the paper
used is the model's ``Metadata.Robustness Protocol``; how that protocol's published table made
its corrupted images (colour order, stored or on the fly) is its
:data:`~mmrobust.corruptions.PUBLISHED_SETUPS` entry, printed beside the number
(:meth:`ZooEntry.published_setting`). An entry with published numbers says what its config's
backbone was pre-trained on (``Metadata.Pre-training``) and, where the published model was
pre-trained otherwise, on what (``Metadata.Published Pre-training``).
"""
import glob
import os.path as osp
import re
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from ..utils.errors import MMRobustError

__all__ = ['ZooEntry', 'METRICS', 'load_zoo', 'zoo_folders', 'build_zoo_model',
           'count_parameters', 'measure_flops', 'update_metadata', 'select', 'zoo_table',
           'readme_rows', 'readme_table', 'update_readme', 'README_MARK', 'check_results',
           'ZooError']

#: metafile metric -> (results metric key, scale to the metafile's unit, summary statistic)
METRICS: Dict[str, Tuple[str, float, str]] = {
    'box AP': ('coco/bbox_mAP', 100., 'P_clean'),
    'mask AP': ('coco/segm_mAP', 100., 'P_clean'),
    'box mPC': ('coco/bbox_mAP', 100., 'mPC'),
    'box rPC': ('coco/bbox_mAP', 100., 'rPC'),
    'mask mPC': ('coco/segm_mAP', 100., 'mPC'),
    'mIoU': ('mIoU', 1., 'P_clean'),
    'mIoU mPC': ('mIoU', 1., 'mPC'),
    'mIoU rPC': ('mIoU', 1., 'rPC'),
}
DATASETS = ('COCO', 'COCO-C', 'Cityscapes', 'Cityscapes-C', 'ADE20K')
CORRUPTED_DATASETS = ('COCO-C', 'Cityscapes-C')
TASKS_OF_DATA = {'COCO': 'Object Detection', 'Cityscapes': 'Semantic Segmentation',
                 'ADE20K': 'Semantic Segmentation'}
REQUIRED_METADATA = ('Training Data', 'Parameters', 'Trainable Parameters', 'FLOPs',
                     'FLOPs Input')


class ZooError(MMRobustError, ValueError):
    """A metafile entry that is malformed or points at nothing."""


@dataclass
class ZooEntry:
    """One ``Models`` entry of a metafile."""
    name: str
    collection: str
    config: str  # relative to the repository root, as in the metafile
    metadata: Dict
    results: List[Dict] = field(default_factory=list)
    metafile: str = ''

    @property
    def params(self) -> int:
        """The parameter count of the metafile entry."""
        return int(self.metadata['Parameters'])

    @property
    def flops(self) -> int:
        """The FLOPs of the metafile entry."""
        return int(self.metadata['FLOPs'])

    @property
    def input_size(self) -> Tuple[int, int]:
        """(width, height) of the FLOPs measurement."""
        w, h = str(self.metadata['FLOPs Input']).lower().split('x')
        return int(w), int(h)

    @property
    def task(self) -> str:
        """The task of the published results, else the one its training data implies."""
        if self.results:
            return self.results[0]['Task']
        return TASKS_OF_DATA.get(self.metadata['Training Data'], 'Image Tokenization')

    @property
    def folder(self) -> str:
        """The config folder (``fan``, ``drvit``, ...)."""
        return osp.basename(osp.dirname(self.config))

    def published(self) -> List[Tuple[str, str, float]]:
        """(dataset, metric, value) of every published number."""
        return [(r['Dataset'], metric, float(value)) for r in self.results
                for metric, value in r['Metrics'].items()]

    def published_setting(self, dataset: str) -> str:
        """How the published number on ``dataset`` was measured, where that matters.

        For a corrupted set: the protocol, colour order and storage of its images (``''`` for a
        clean set).
        """
        if dataset not in CORRUPTED_DATASETS:
            return ''
        from ..corruptions import PUBLISHED_SETUPS
        protocol = self.metadata['Robustness Protocol']
        setup = PUBLISHED_SETUPS[protocol]
        if setup.source == 'on-the-fly':
            storage = 'corrupted on the fly'
        elif setup.jpeg_quality:
            storage = f'stored as JPEG quality {setup.jpeg_quality}'
        else:
            storage = 'stored losslessly'
        return f'{protocol}, {"BGR" if setup.bgr_compat else "RGB"} colour order, {storage}'


def zoo_folders(repo: str) -> List[str]:
    """The config folders that hold a metafile."""
    return sorted(osp.dirname(p) for p in glob.glob(osp.join(repo, 'configs', '*',
                                                             'metafile.yml')))


def _check_entry(entry: ZooEntry, collections: Sequence[str], repo: str) -> None:
    where = f'{entry.metafile}: {entry.name}'
    if entry.collection not in collections:
        raise ZooError(f'{where}: In Collection {entry.collection!r} is not one of the '
                       f'Collections {list(collections)}')
    if not osp.isfile(osp.join(repo, entry.config)):
        raise ZooError(f'{where}: Config {entry.config} does not exist')
    missing = [k for k in REQUIRED_METADATA if k not in entry.metadata]
    if missing:
        raise ZooError(f'{where}: Metadata lacks {missing}')
    for result in entry.results:
        if set(result) - {'Task', 'Dataset', 'Metrics'} or 'Metrics' not in result:
            raise ZooError(f'{where}: a Results item has Task, Dataset and Metrics only, got '
                           f'{sorted(result)}')
        if result.get('Dataset') not in DATASETS:
            raise ZooError(f'{where}: Dataset {result.get("Dataset")!r} is not one of '
                           f'{DATASETS}')
        unknown = set(result['Metrics']) - set(METRICS)
        if unknown:
            raise ZooError(f'{where}: unknown metrics {sorted(unknown)}; known: '
                           f'{sorted(METRICS)}')
    if entry.results and 'Pre-training' not in entry.metadata:
        raise ZooError(f'{where}: an entry with published numbers says what its backbone was '
                       'pre-trained on (Metadata.Pre-training)')
    if any(r['Dataset'] in CORRUPTED_DATASETS for r in entry.results):
        from ..corruptions import PUBLISHED_SETUPS
        protocol = entry.metadata.get('Robustness Protocol')
        if protocol not in PUBLISHED_SETUPS:
            raise ZooError(f'{where}: a published corruption number needs the protocol it was '
                           'measured on (Metadata.Robustness Protocol), one of '
                           f'{sorted(PUBLISHED_SETUPS)} (PUBLISHED_SETUPS says how its '
                           f'images were made); got {protocol!r}')


def load_zoo(repo: str) -> List[ZooEntry]:
    """Every entry of every ``configs/*/metafile.yml``, checked for form and for its config."""
    import yaml
    entries: List[ZooEntry] = []
    for folder in zoo_folders(repo):
        path = osp.join(folder, 'metafile.yml')
        rel = osp.relpath(path, repo)
        with open(path) as f:
            data = yaml.safe_load(f)
        collections = [c['Name'] for c in data.get('Collections', [])]
        for model in data.get('Models', []):
            try:
                entry = ZooEntry(model['Name'], model['In Collection'], model['Config'],
                                 dict(model.get('Metadata') or {}),
                                 list(model.get('Results') or []), rel)
            except KeyError as err:
                raise ZooError(f'{rel}: a model entry lacks {err} ({model.get("Name")})') from None
            _check_entry(entry, collections, repo)
            entries.append(entry)
    names = [e.name for e in entries]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ZooError(f'model names appear more than once in the metafiles: {twice}')
    return entries


# -- measuring ------------------------------------------------------------------------------------

def build_zoo_model(config: str) -> torch.nn.Module:
    """A config's model as built by the Runner.

    No pretrained weights are loaded (the parameter count is the architecture's; nothing is
    downloaded or read), from a fixed seed: a two-stage detector's proposals, and with them its RoI
    heads' FLOPs, are then the same in every run on one machine.
    """
    from mmengine.config import Config
    from mmengine.registry import MODELS, init_default_scope

    # NOTE: mmrobust's modules are registered: importing this module imported the package
    cfg = Config.fromfile(config)
    init_default_scope(cfg.default_scope)
    torch.manual_seed(0)
    return MODELS.build(cfg.model)


def count_parameters(model: torch.nn.Module) -> Tuple[int, int]:
    """(all, trainable) parameters.

    Dr-ViT's frozen tokenizer and FAN's frozen class-token path count in the first only.
    """
    return (sum(p.numel() for p in model.parameters()),
            sum(p.numel() for p in model.parameters() if p.requires_grad))


def measure_flops(model: torch.nn.Module, size: Tuple[int, int]) -> int:
    """FLOPs of one test-mode forward of a ``width x height`` image.

    Through a model of :func:`build_zoo_model` (``model._forward``: backbone, neck and heads; a
    two-stage detector's RoI heads on the RPN's proposals), counted as the project's benchmarks
    count
    (:func:`mmrobust.utils.flops.count_flops`). The model keeps its constructors' initialisation; no
    pretrained weights are read.
    """
    from ..utils.flops import count_flops
    width, height = size
    model.eval()
    if hasattr(model, 'tokenizer') and not hasattr(model, 'backbone'):
        # a tokenizer's recipe (VQTokenizerTrainer): one encode-quantise-decode round trip
        image = torch.rand(1, 3, height, width)
        return count_flops(lambda: model.tokenizer.reconstruct(image))
    meta = dict(img_shape=(height, width), ori_shape=(height, width),
                pad_shape=(height, width), batch_input_shape=(height, width),
                scale_factor=(1., 1.))
    if hasattr(model, 'decode_head'):
        from mmseg.structures import SegDataSample
        sample = SegDataSample(metainfo=meta)
    else:
        from mmdet.structures import DetDataSample
        sample = DetDataSample(metainfo=meta)
    inputs = torch.randn(1, 3, height, width)
    return count_flops(lambda: model._forward(inputs, [sample]))


def update_metadata(metafile: str, name: str, values: Mapping[str, int]) -> None:
    """Rewrite ``Metadata`` integers of one metafile entry in place, atomically.

    Rewrite ``Metadata`` integers (``Parameters``, ``FLOPs``, ...) of one entry of a metafile in
    place, atomically, leaving every other line (comments, order) as it is.
    """
    from ..utils.io import atomic_bytes
    with open(metafile) as f:
        lines = f.read().split('\n')
    start = next((i for i, line in enumerate(lines)
                  if re.fullmatch(rf'\s*- Name: {re.escape(name)}\s*', line)), None)
    if start is None:
        raise ZooError(f'{metafile}: no entry named {name}')
    end = next((i for i in range(start + 1, len(lines))
                if re.match(r'\s*- Name: ', lines[i])), len(lines))
    todo = dict(values)
    for i in range(start, end):
        m = re.fullmatch(r'(\s*)([A-Za-z ]+): (\d+)\s*', lines[i])
        if m and m[2] in todo:
            lines[i] = f'{m[1]}{m[2]}: {int(todo.pop(m[2]))}'
    if todo:
        raise ZooError(f'{metafile}: {name} has no Metadata lines for {sorted(todo)}')
    atomic_bytes(metafile, '\n'.join(lines).encode())


# -- reporting ------------------------------------------------------------------------------------

def _fmt_count(n: float, unit: str) -> str:
    return f'{n / 1e6:.2f}M' if unit == 'params' else f'{n / 1e9:.1f}G'


def select(entries: Sequence[ZooEntry], task: str = '', family: str = '') -> List[ZooEntry]:
    """The entries whose task and family contain the given words, case-insensitively.

    The family is the config folder, the collection or one of its ``Training Techniques`` (DAT).
    """
    def has(text: str, word: str) -> bool:
        return word.lower() in text.lower()
    return [e for e in entries if has(e.task, task) and any(
        has(f, family) for f in (e.folder, e.collection,
                                 *e.metadata.get('Training Techniques', ())))]


def zoo_table(entries: Sequence[ZooEntry]) -> str:
    """Markdown: every entry with its size, cost and published numbers."""
    lines = ['| model | params | FLOPs (input) | published (paper) | config |',
             '|---|---|---|---|---|']
    for e in entries:
        published = '; '.join(f'{d} {m} {v:g}' for d, m, v in e.published()) or '—'
        lines.append(f'| {e.name} | {_fmt_count(e.params, "params")} | '
                     f'{_fmt_count(e.flops, "flops")} ({e.metadata["FLOPs Input"]}) | '
                     f'{published} | {e.config} |')
    return '\n'.join(lines)


def _published_cell(e: ZooEntry) -> List[str]:
    """A README row's published numbers.

    Each with its setting, and the published model's pre-training where it is not this config's.
    """
    lines = []
    for dataset, metric, value in e.published():
        setting = e.published_setting(dataset)
        lines.append(f'{dataset} {metric} {value:g}' + (f' ({setting})' if setting else ''))
    if lines and e.metadata.get('Published Pre-training'):
        lines.append(f'published with {e.metadata["Published Pre-training"]} pre-training; '
                     f'this config: {e.metadata["Pre-training"]}')
    return lines


def readme_rows(entries: Sequence[ZooEntry]) -> List[str]:
    """The Markdown table of a config folder's README.md.

    One row per entry, with links relative to the folder (the README's rows are these lines, checked
    by the tests).
    """
    lines = ['| model | params (trainable) | FLOPs (input) | published, not reproduced here '
             '| config |', '|---|---|---|---|---|']
    for e in entries:
        trainable = int(e.metadata['Trainable Parameters'])
        params = _fmt_count(e.params, 'params')
        if trainable != e.params:
            params += f' ({_fmt_count(trainable, "params")})'
        published = '<br>'.join(_published_cell(e)) or '—'
        config = osp.basename(e.config)
        lines.append(f'| {e.name} | {params} | {_fmt_count(e.flops, "flops")} '
                     f'({e.metadata["FLOPs Input"]}) | {published} | [config](./{config}) |')
    return lines


#: the line above a config folder README's table (the table ends at the first blank line)
README_MARK = '<!-- model zoo table: python tools/analysis_tools/model_zoo.py --readme {} -->'


def _table_span(lines: List[str], folder: str) -> Tuple[int, int]:
    mark = README_MARK.format(folder)
    if mark not in lines:
        raise ZooError(f'configs/{folder}/README.md has no line {mark!r} above its table')
    start = lines.index(mark) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return start, end


def readme_table(readme: str, folder: str) -> List[str]:
    """The table lines under :data:`README_MARK` in a folder's README text."""
    lines = readme.split('\n')
    start, end = _table_span(lines, folder)
    return lines[start:end]


def update_readme(path: str, folder: str, rows: Sequence[str]) -> None:
    """Replace the table under :data:`README_MARK` of a folder's README, atomically."""
    from ..utils.io import atomic_bytes
    with open(path) as f:
        lines = f.read().split('\n')
    start, end = _table_span(lines, folder)
    lines[start:end] = list(rows)  # `end` is the blank line after the table, kept
    atomic_bytes(path, '\n'.join(lines).encode())


def _entry_for(results: Mapping, entries: Sequence[ZooEntry]) -> ZooEntry:
    config = str(results.get('config') or '')
    name = osp.splitext(osp.basename(config))[0]
    for e in entries:
        if osp.splitext(osp.basename(e.config))[0] == name:
            return e
    raise ZooError(f'the results were computed with config {config or "(none recorded)"}, '
                   'which has no model-zoo entry; `python tools/analysis_tools/model_zoo.py` '
                   'lists the configs that have one.')


def _setup_differences(results: Mapping, protocol: str) -> List[str]:
    """How the results' corrupted images differ from the published table's.

    Colour order, on the fly or stored, JPEG quality of a stored set.
    """
    from ..corruptions import PUBLISHED_SETUPS
    setup = PUBLISHED_SETUPS.get(protocol)
    if setup is None:
        return []
    out = []
    if bool(results.get('bgr_compat')) != setup.bgr_compat:
        out.append(f'colour order {"BGR" if results.get("bgr_compat") else "RGB"}, published '
                   f'{"BGR" if setup.bgr_compat else "RGB"}')
    if results.get('source') != setup.source:
        out.append(f'images {results.get("source")}, published {setup.source}')
    stored = results.get('stored_set') or {}
    if setup.jpeg_quality and results.get('source') == 'stored' and (
            stored.get('lossless') or stored.get('jpeg_quality') != setup.jpeg_quality):
        out.append(f'stored {"lossless" if stored.get("lossless") else "as JPEG quality "}'
                   f'{"" if stored.get("lossless") else stored.get("jpeg_quality")}, published '
                   f'JPEG quality {setup.jpeg_quality}')
    if out:
        out.append(f'published: {setup.origin}; reproduce with {setup.flags}')
    return out


def check_results(results: Mapping, entries: Sequence[ZooEntry],
                  path: Optional[str] = None) -> Tuple[ZooEntry, List[str]]:
    """Lines comparing a results dict with its config's published numbers.

    Lines comparing a ``test_robustness.py`` results dict with the published numbers of its config's
    zoo entry (``P_clean 41.9 vs published 42.0``).

    A corrupted-set number is not compared when cells of the run's protocol are missing (a
    partial file), and is marked not comparable when the protocol or the way the images were
    corrupted (colour order, stored or on the fly, JPEG quality) is not the published table's,
    with the flags that reproduce it. With ``path`` and the run's per-image statistics, each
    number comes with its bootstrap interval.
    """
    from ..evaluation.report import summarize
    entry = _entry_for(results, entries)
    summarized = summarize(results)
    summary = summarized['metrics']
    missing = summarized['missing']
    planned = len(missing) + summarized['cells']
    protocol = entry.metadata.get('Robustness Protocol')
    intervals = _intervals(path, results) if path else {}
    differences = _setup_differences(results, protocol) if protocol else []
    lines = []
    for dataset, metric, value in entry.published():
        key, scale, stat = METRICS[metric]
        name = next((k for k in summary if k == key or k.endswith('/' + key)), None)
        corrupted = dataset.endswith('-C')
        if not corrupted and stat != 'P_clean':
            continue
        if name is None:
            lines.append(f'{dataset} {metric}: not in the results (metrics: '
                         f'{", ".join(summary) or "none"}) vs published {value:g}')
            continue
        if (corrupted or stat == 'rPC') and missing:
            lines.append(f'{dataset} {metric}: not compared: {len(missing)} of {planned} cells '
                         f'of {results.get("protocol")} are missing (a partial results file: '
                         f'finish the run) vs published {value:g}')
            continue
        factor = 100. if stat == 'rPC' else scale
        got = summary[name][stat] * factor
        shown = f'{got:.1f}'
        iv = intervals.get(name, {}).get(stat)
        if iv is not None:
            from ..evaluation.uncertainty import Bootstrap
            shown += (f' [{iv[0] * factor:.1f}, {iv[1] * factor:.1f}; '
                      f'{Bootstrap().confidence:.0%}, {Bootstrap().replicates} replicates]')
        note = ''
        if corrupted and protocol and str(results.get('protocol')).split(':')[0] != protocol:
            note = (f' (published on protocol {protocol}, these results are '
                    f'{results.get("protocol")}: not comparable)')
        elif corrupted and differences:
            note = f' (not comparable: {"; ".join(differences)})'
        lines.append(f'{dataset} {metric}: {stat} {shown} vs published {value:g}{note}')
    if not lines:
        lines.append(f'{entry.name} has no published numbers to compare with')
    return entry, lines


def _intervals(path: str, results: Mapping) -> Dict[str, Dict[str, Tuple[float, float]]]:
    """The bootstrap intervals of P_clean / mPC / rPC from the run's per-image statistics.

    {} without them.
    """
    from ..evaluation.uncertainty import Bootstrap, interval, replicates_of
    if results.get('protocol') == 'mmdet-results':
        return {}
    boot = Bootstrap()
    _, reps = replicates_of(path, results, boot)
    return {name: {q: interval(entry[q], boot.confidence) for q in ('P_clean', 'mPC', 'rPC')
                   if q in entry} for name, entry in reps.items()}
