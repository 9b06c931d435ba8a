"""Every config in configs/ builds its model, hooks and dataloaders under its own scope.

Models of the model zoo (configs/*/metafile.yml) have the parameter counts their entries list.
Configs for the real datasets are built on the toy data of the same format when the real data
is not there (COCO -> toy COCO, Cityscapes -> toy Cityscapes); the toy configs also run a
training and a test batch through the model.
"""
import copy
import os.path as osp
import re

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import HOOKS, MODELS, init_default_scope
from mmengine.runner import Runner

from mmrobust.apis.model_zoo import count_parameters, load_zoo
from mmrobust.datasets import TOY_COCO_CLASSES
from mmrobust.engine import DATHook
from mmrobust.utils import (
    DatasetNotFoundError,
    check_custom_imports,
    check_dataset_paths,
    config_scope,
    leaf_datasets,
)

from helpers import ALL_CONFIGS, REPO, config_id

ZOO = {osp.normpath(e.config): e for e in load_zoo(str(REPO))}

LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')
TOY_ROOTS = {'CocoDataset': ('data/toy_coco/', dict(classes=TOY_COCO_CLASSES)),
             'CityscapesDataset': ('data/toy_cityscapes/', None)}


def _on_toy_data(loader_cfg):
    """Point a real-data loader at the toy set of the same format, if the data is missing."""
    ds, = leaf_datasets(loader_cfg['dataset'])
    if osp.isdir(ds.get('data_root', '')):
        return True
    if ds['type'] not in TOY_ROOTS:
        return False
    ds['data_root'], metainfo = TOY_ROOTS[ds['type']]
    if metainfo is not None:
        ds['metainfo'] = metainfo
    return True


def test_there_are_toy_configs_for_both_tasks():
    # the CPU-sized ones (reading every config takes ~10 s: test_config_builds reads each)
    toy = [p for p in ALL_CONFIGS if p.parent.name == 'toy']
    assert {Config.fromfile(p).default_scope for p in toy} == {'mmdet', 'mmseg'}


def _weight_paths(node) -> list:
    """Every pretrained file a config's model, hooks and ``load_from`` name."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in (
            [v] if k in ('checkpoint', 'load_from', 'pretrained') and isinstance(v, str)
            else _weight_paths(v))]
    if isinstance(node, (list, tuple)):
        return [p for v in node for p in _weight_paths(v)]
    return []


def _readme_weight_table() -> dict:
    """The checkpoints guide's table of where each config's weights come from: file -> row."""
    text = (REPO / 'docs' / 'en' / 'user_guides' / 'checkpoints.md').read_text()
    section = text.split("## Where each config's weights come from", 1)[1].split('\n#', 1)[0]
    table = {}
    for row in (line for line in section.splitlines() if line.startswith('| `')):
        for name in re.findall(r'`([^`]+)`', row.split(' | ')[0]):
            # `a_{x,y}.pth` names a_x.pth and a_y.pth
            m = re.fullmatch(r'(.*)\{([^}]*)\}(.*)', name)
            for alt in m[2].split(',') if m else ['']:
                table[f'{m[1]}{alt}{m[3]}' if m else name] = row
    return table


WEIGHTS = _readme_weight_table()


def test_weight_table_commands_exist():
    rows = set(WEIGHTS.values())
    assert len(rows) >= 8
    for row in rows:
        for tool in re.findall(r'python (tools/\S+\.py)', row):
            assert (REPO / tool).is_file(), f'the weight table names {tool}'


@pytest.mark.parametrize('path', ALL_CONFIGS, ids=config_id)
def test_config_builds(path, toy_data, in_repo):
    cfg = Config.fromfile(path)
    # every file it loads is a local path with a way to make it (the checkpoints guide's table)
    for weights in _weight_paths({k: cfg.get(k) for k in ('model', 'custom_hooks', 'load_from')}):
        assert '://' not in weights, f'{weights}: a download at run time; take a local path'
        assert weights in WEIGHTS, (f'{weights} has no row in the table "Where each config\'s '
                                    'weights come from" of docs/en/user_guides/checkpoints.md')
    scope = config_scope(cfg)
    assert cfg.custom_imports.imports == ['mmrobust']
    check_custom_imports(cfg)
    init_default_scope(scope)
    is_toy = 'toy' in osp.basename(path)
    tokenizer = cfg.model.get('backbone', {}).get('tokenizer')
    if is_toy and tokenizer:
        tokenizer.init_cfg = None  # Dr-ViT: the arch the config names, not its trained weights
    model = MODELS.build(cfg.model)
    entry = ZOO.get(osp.normpath(osp.relpath(path, REPO)))
    if entry is not None:  # the model zoo's sizes are the built model's
        assert count_parameters(model) == (entry.params,
                                           int(entry.metadata['Trainable Parameters']))
    if is_toy:
        model.init_weights()
    hooks = [HOOKS.build(copy.deepcopy(h)) for h in cfg.get('custom_hooks', [])]
    for hook in hooks:
        if isinstance(hook, DATHook):
            # the architecture the config names, without its (locally trained) weights
            hook.tokenizer = MODELS.build(dict(hook.tokenizer_cfg, init_cfg=None))
            if is_toy:
                hook.attach(model)
    for key in LOADERS:
        loader_cfg = cfg[key].copy()
        loader_cfg.update(num_workers=0, persistent_workers=False, batch_size=1)
        if not _on_toy_data(loader_cfg):
            # no toy set of this format: the tools stop with a clear error instead
            with pytest.raises(DatasetNotFoundError, match='data/README.md'):
                check_dataset_paths(cfg, [key])
            continue
        loader = Runner.build_dataloader(loader_cfg, seed=0)
        assert len(loader.dataset) > 0
        if not is_toy:
            continue
        batch = next(iter(loader))
        if key == 'train_dataloader':
            model.train()
            dat = next((h for h in hooks if isinstance(h, DATHook)), None)
            data = (dat.attack_batch(batch, 0) if dat is not None else
                    model.data_preprocessor(batch, True))
            if any(isinstance(h, DATHook) for h in hooks):
                assert len(data['inputs']) == 2 * len(batch['inputs'])  # mode='append'
            if hasattr(model, 'roi_head'):
                # mmcv's RoIAlign ignores strides: the RoI head must get contiguous NCHW maps
                assert all(f.is_contiguous() for f in model.extract_feat(data['inputs']))
            losses = model(**data, mode='loss')
            total = sum(v.sum() for k, v in losses.items() if 'loss' in k
                        for v in (v if isinstance(v, list) else [v]))
            assert torch.isfinite(total)
        else:
            model.eval()
            with torch.no_grad():
                assert len(model.test_step(batch)) == 1


def test_the_data_check_asks_only_for_what_the_pipeline_opens(tmp_path):
    """A prefix nothing opens is not asked for; one a pipeline opens is.

    mmdet's Mask2Former instance config inherits its panoptic base's ``seg`` prefix, which
    ``CocoDataset`` never opens: no refusal on a plain COCO instance set (mmdet's own tools/test.py
    runs it); a pipeline that loads segmentation maps still needs them.
    """
    from pathlib import Path

    import mmdet
    stock = (Path(mmdet.__file__).parent / '.mim/configs/mask2former/'
             'mask2former_r50_8xb2-lsj-50e_coco.py')
    cfg = Config.fromfile(str(stock))
    (tmp_path / 'val2017').mkdir()
    (tmp_path / 'annotations').mkdir()
    (tmp_path / 'annotations/instances_val2017.json').write_text('{}')
    cfg.test_dataloader.dataset.data_root = f'{tmp_path}/'
    dataset = cfg.test_dataloader.dataset
    assert dataset.data_prefix.get('seg') and not (tmp_path / dataset.data_prefix.seg).exists()
    check_dataset_paths(cfg, ['test_dataloader'])
    load = next(s for s in dataset.pipeline if s['type'] == 'LoadAnnotations')
    load['with_seg'] = True
    with pytest.raises(DatasetNotFoundError, match='panoptic_val2017'):
        check_dataset_paths(cfg, ['test_dataloader'])
    # mmseg's LoadAnnotations always opens the label maps
    seg = Config(dict(default_scope='mmseg', test_dataloader=dict(dataset=dict(
        type='CityscapesDataset', data_root=str(tmp_path),
        data_prefix=dict(img_path='val2017', seg_map_path='gtFine/val'),
        pipeline=[dict(type='LoadImageFromFile'), dict(type='LoadAnnotations')]))))
    with pytest.raises(DatasetNotFoundError, match='gtFine'):
        check_dataset_paths(seg, ['test_dataloader'])
