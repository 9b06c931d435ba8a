"""What ``tools/train.py`` and ``tools/test.py`` do to a config, for detection and segmentation.

The config's ``default_scope`` decides the task; everything else is shared, so there is one set
of tools instead of parallel mmdet/mmseg copies.
"""
import argparse
import logging
import os
import os.path as osp
import warnings
from copy import deepcopy
from typing import Optional, Union

import torch
import torch.distributed as dist
from mmengine.config import Config, ConfigDict, DictAction
from mmengine.logging import print_log
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from mmrobust.utils.config_checks import (
    check_custom_imports,
    check_dataset_paths,
    config_scope,
    explain_registry_errors,
    leaf_datasets,
)

from ..models.checkpoint import load_checkpoint_strict, loaded_module
from ..utils.errors import ConfigError, InputNotFoundError, UsageError

__all__ = ['apply_common_args', 'apply_train_args', 'apply_test_args', 'build_runner',
           'init_model', 'setup_distributed', 'add_partial_load_arg']


def add_launch_args(parser: argparse.ArgumentParser) -> None:
    """The arguments every tool shares: ``--cfg-options``, ``--launcher`` and the local rank."""
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, key=value (e.g. '
                        'train_cfg.max_iters=100 or "key=[a,b]")')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    add_partial_load_arg(parser)


def add_partial_load_arg(parser: argparse.ArgumentParser) -> None:
    """``--allow-partial-load``: the opt-out of strict whole-model checkpoint loading."""
    parser.add_argument('--allow-partial-load', action='store_true',
                        help='load a checkpoint that does not match the model exactly (missing, '
                        'unexpected or mis-shaped keys are logged instead of stopping the run; '
                        'e.g. fine-tuning with another number of classes)')


def parse_launch_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse a tool's arguments (with :func:`add_launch_args`) and export ``LOCAL_RANK``."""
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def apply_common_args(cfg: Config, config_path: str, launcher: str, work_dir: Optional[str],
                      cfg_options: Optional[dict]) -> Config:
    """Apply ``--cfg-options``, ``--work-dir`` and ``--launcher`` to ``cfg``.

    The work dir defaults to ``work_dirs/<config name>``.
    """
    cfg.launcher = launcher
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(config_path))[0])
    config_scope(cfg)
    return cfg


def apply_train_args(cfg: Config, resume: Optional[str], amp: bool,
                     auto_scale_lr: bool) -> Config:
    """``--resume [path]``, ``--amp`` and ``--auto-scale-lr`` as in mmdet's train.py."""
    if amp:
        # NOTE: one wrapper, or several (e.g. a tokenizer's generator and discriminator)
        wrappers = [cfg.optim_wrapper] if 'optimizer' in cfg.optim_wrapper else [
            w for w in cfg.optim_wrapper.values() if isinstance(w, dict) and 'optimizer' in w]
        for wrapper in wrappers:
            if wrapper.get('type') in ('AmpOptimWrapper', 'CPUAmpOptimWrapper'):
                warnings.warn('the config already uses mixed precision; --amp changes nothing')
            elif torch.cuda.is_available():
                wrapper.type = 'AmpOptimWrapper'
                wrapper.loss_scale = 'dynamic'
            else:
                wrapper.type = 'CPUAmpOptimWrapper'  # bfloat16 autocast
        if wrappers and not torch.cuda.is_available():
            imports = cfg.setdefault('custom_imports', dict(imports=[])).setdefault('imports', [])
            if 'mmrobust' not in imports:
                imports.append('mmrobust')
    if auto_scale_lr:
        if 'enable' not in cfg.get('auto_scale_lr', {}) or \
                'base_batch_size' not in cfg.auto_scale_lr:
            raise ConfigError(
                '--auto-scale-lr needs `auto_scale_lr = dict(enable=False, base_batch_size=N)` in '
                'the config, N being the total batch size its learning rate was tuned for.')
        cfg.auto_scale_lr.enable = True
    if resume is not None and osp.isfile(osp.join(cfg.work_dir, 'latest_state.pth')) and \
            not osp.isfile(osp.join(cfg.work_dir, 'last_checkpoint')):
        raise ConfigError(
            f"{cfg.work_dir} holds a state of the former train_vq loop (latest_state.pth), which "
            'the Runner cannot resume. Its tokenizer.pth still loads into VQGAN (e.g. as the '
            "tokenizer's init_cfg checkpoint); to continue training, start a new work dir.")
    if resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif resume is not None:
        if not osp.isfile(resume):
            raise InputNotFoundError(f'--resume {resume}: no such checkpoint file')
        cfg.resume, cfg.load_from = True, resume
    return cfg


def _trigger_visualization(cfg: Config, show: bool, show_dir: Optional[str],
                           wait_time: float) -> None:
    hook = cfg.default_hooks.get('visualization')
    if hook is None:
        raise ConfigError("--show/--show-dir need a visualization hook in default_hooks: "
                          "default_hooks = dict(visualization=dict(type='"
                          f"{'Det' if config_scope(cfg) == 'mmdet' else 'Seg'}"
                          "VisualizationHook'))")
    hook['draw'] = True
    if show:
        hook['show'], hook['wait_time'] = True, wait_time
    if show_dir:
        if config_scope(cfg) == 'mmdet':
            hook['test_out_dir'] = show_dir
        else:
            cfg.visualizer['save_dir'] = show_dir


def _enable_tta(cfg: Config) -> None:
    if 'tta_model' not in cfg or 'tta_pipeline' not in cfg:
        if config_scope(cfg) == 'mmseg':
            raise ConfigError('--tta needs `tta_model` and `tta_pipeline` in the config')
        warnings.warn('no tta_model/tta_pipeline in the config: using horizontal-flip TTA')
        cfg.setdefault('tta_model', dict(type='DetTTAModel', tta_cfg=dict(
            nms=dict(type='nms', iou_threshold=0.5), max_per_img=100)))
        if 'tta_pipeline' not in cfg:
            pipeline = deepcopy(leaf_datasets(cfg.test_dataloader.dataset)[0]['pipeline'])
            pipeline[-1] = dict(type='TestTimeAug', transforms=[
                [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
                [dict(type='PackDetInputs', meta_keys=(
                    'img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor', 'flip',
                    'flip_direction'))]])
            cfg.tta_pipeline = pipeline
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline


def apply_test_args(cfg: Config, checkpoint: str, *, out: Optional[str] = None,
                    show: bool = False, show_dir: Optional[str] = None, wait_time: float = 0,
                    tta: bool = False) -> Config:
    """``--out``, ``--show``, ``--show-dir`` and ``--tta`` with the task's own semantics."""
    if not osp.isfile(checkpoint):
        # NOTE: a newcomer's first missing checkpoint is the toy detector's, which nothing trained
        toy = ' (`bash tools/demo_toy.sh CONFIG` for a toy config)' if '/toy/' in str(
            cfg.filename or '') or 'toy' in osp.basename(checkpoint) else ''
        raise InputNotFoundError(
            f'checkpoint {checkpoint!r} does not exist: train one with `python tools/train.py '
            f'CONFIG --work-dir DIR`{toy} (DIR/last_checkpoint names its last checkpoint), or '
            'give the path of one you have')
    cfg.load_from = checkpoint
    # a COCO metric given `backend=...` (e.g. --cfg-options test_evaluator.backend=...) is
    # evaluated by that library; one without keeps mmdet's CocoMetric
    from ..evaluation.evaluator_cfg import select_coco_backend
    select_coco_backend(cfg.test_evaluator)
    if show or show_dir:
        _trigger_visualization(cfg, show, show_dir, wait_time)
    if tta:
        _enable_tta(cfg)
    if out is not None and config_scope(cfg) == 'mmseg':
        # mmseg's IoUMetric writes one PNG per image into a folder
        cfg.test_evaluator['output_dir'] = out
        cfg.test_evaluator['keep_results'] = True
    elif out is not None and not out.endswith(('.pkl', '.pickle')):
        raise UsageError(f'--out {out}: detection results are dumped to a .pkl file')
    return cfg


def setup_distributed(cfg: Config) -> None:
    """Start the process group on CPU-only machines (gloo); mmengine assumes CUDA devices.

    mmengine's ``init_dist('pytorch')`` calls ``torch.cuda.set_device`` and its DDP wrapper passes
    ``device_ids=[LOCAL_RANK]``, both of which fail without GPUs. On GPUs nothing changes (NCCL).
    """
    if cfg.launcher == 'none' or torch.cuda.is_available():
        return
    if cfg.launcher != 'pytorch':
        raise ConfigError(f'--launcher {cfg.launcher} needs GPUs; on CPU use '
                          '`bash tools/dist_train.sh CONFIG N` (torchrun, gloo)')
    if not dist.is_initialized():
        dist.init_process_group(backend='gloo', rank=int(os.environ['RANK']),
                                world_size=int(os.environ['WORLD_SIZE']))
    cfg.env_cfg.setdefault('dist_cfg', {})['backend'] = 'gloo'
    # NOTE: SyncBN in the model's norm configs, or all BN turned into SyncBN by the Runner
    # (`sync_bn`, as the tokenizer configs ask for DDP)
    sync = _replace_sync_bn(cfg.model)
    if cfg.get('sync_bn'):
        cfg.sync_bn, sync = None, True
    if sync:
        print_log('SyncBN needs GPUs: using per-process BN for this CPU run', logger='current')
    wrapper = cfg.get('model_wrapper_cfg') or dict(type='MMDistributedDataParallel')
    wrapper.setdefault('broadcast_buffers', False)
    wrapper.setdefault('find_unused_parameters', cfg.get('find_unused_parameters', False))
    wrapper['device_ids'] = None
    cfg.model_wrapper_cfg = wrapper


def _replace_sync_bn(obj) -> bool:
    """Turn SyncBN norm configs into BN in place; True if any was found."""
    found = False
    if isinstance(obj, dict):
        if obj.get('type') in ('SyncBN', 'MMSyncBN'):
            obj['type'], found = 'BN', True
        for value in obj.values():
            found |= _replace_sync_bn(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            found |= _replace_sync_bn(value)
    return found


def _check_not_an_old_tokenizer_config(cfg: Config) -> None:
    """Refuse a tokenizer config of the former train_vq loop, saying how to move.

    Tokenizer configs of the former hand-written train_vq loop (``data=``, ``train=``) say how to
    move to the Runner instead of failing on missing dataloaders.
    """
    if 'train' in cfg and 'data' in cfg and 'train_dataloader' not in cfg:
        raise ConfigError(
            'this is a tokenizer config for the former train_vq loop (`data=` and `train=`); '
            'tokenizers now train with mmengine\'s Runner. Start from configs/tokenizers/'
            'vq-small-f16_toy-coco.py: model=dict(type=\'VQTokenizerTrainer\', '
            'tokenizer=<your model>, recon_loss, codebook_ema, gan_weight, dead_code_interval), '
            'data.config -> the ImageCropsDataset `config` of train/val_dataloader, '
            'train.iters -> train_cfg.max_iters, batch_size/crop_size/scale_range -> '
            'train_dataloader, lr/betas -> optim_wrapper.generator.optimizer, '
            'lr_schedule=cosine -> param_scheduler, preview_interval -> train_cfg.val_interval, '
            'checkpoint_interval -> default_hooks.checkpoint.interval.')


def build_runner(cfg: Config, loaders: tuple, allow_partial_load: bool = False) -> Runner:
    """Check the config, then build its runner with actionable registry errors.

    The runner loads whole-model checkpoints (``load_from``, resume, test) strictly through
    :class:`~mmrobust.engine.StrictLoadHook`.

    Args:
        cfg: Config after the command-line arguments were applied.
        loaders: Dataloader keys whose dataset paths must exist.
        allow_partial_load: log checkpoint mismatches instead of stopping (the explicit opt-out).
    """
    from ..engine.hooks.strict_load import StrictLoadHook
    _check_not_an_old_tokenizer_config(cfg)
    check_custom_imports(cfg)
    check_dataset_paths(cfg, list(loaders))
    setup_distributed(cfg)
    with explain_registry_errors():
        runner = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
    if 'train_dataloader' in loaders:
        _summarise_frozen_parameters(runner)
    strict = [h for h in runner.hooks if isinstance(h, StrictLoadHook)]
    if strict:  # NOTE: declared in the config (as documented for the stock tools)
        strict[0].allow_partial |= allow_partial_load
    else:
        runner.register_hook(StrictLoadHook(allow_partial_load))
    return runner


class _FrozenParameterLines(logging.Filter):
    """Drops mmengine's optimizer-constructor line per frozen parameter.

    27 for a FAN detector's class-token path. :func:`_summarise_frozen_parameters` says it once.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return 'is skipped since its requires_grad=False' not in record.getMessage()


def _summarise_frozen_parameters(runner: Runner) -> None:
    frozen = [n for n, p in loaded_module(runner.model).named_parameters() if not p.requires_grad]
    if not frozen:
        return
    groups: dict = {}
    for name in frozen:
        group = '.'.join(name.split('.')[:3])
        groups[group] = groups.get(group, 0) + 1
    runner.logger.info(
        f'{len(frozen)} frozen parameters are left out of the optimizer: '
        + ', '.join(g if n == 1 and g in frozen else f'{g}.* ({n})' for g, n in groups.items()))
    runner.logger.addFilter(_FrozenParameterLines())


def init_model(config: Union[str, Config], checkpoint: Optional[str] = None,
               device: str = 'cpu', allow_partial_load: bool = False) -> torch.nn.Module:
    """``init_detector`` / ``mmseg.apis.init_model`` with a strict checkpoint load.

    mmdet's and mmseg's initialisers load with ``strict=False`` and go on with whatever matched;
    this one stops with the missing, unexpected and mis-shaped keys unless
    ``allow_partial_load``, and keeps the checkpoint's ``dataset_meta`` as they do.
    """
    cfg = Config.fromfile(config) if isinstance(config, str) else config
    check_custom_imports(cfg)
    if config_scope(cfg) == 'mmdet':
        from mmdet.apis import init_detector as init
    else:
        from mmseg.apis import init_model as init
    model = init(cfg, None, device='cpu')
    if checkpoint is None:
        return model
    raw = load_checkpoint_strict(model, checkpoint, allow_partial_load)
    meta = raw.get('meta', {}).get('dataset_meta') if isinstance(raw, dict) else None
    if meta:  # NOTE: as the stock initialisers: lower-case keys, the config's palette kept
        meta = {k.lower(): v for k, v in meta.items()}
        meta.setdefault('palette', getattr(model, 'dataset_meta', {}).get('palette', 'random'))
        model.dataset_meta = meta
    return model.to(device).eval()
