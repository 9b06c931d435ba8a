"""FAN's detection recipe in the Cascade Mask R-CNN configs, piece by piece.

FAN's detection recipe in the Cascade Mask R-CNN configs whose targets are FAN's published COCO /
COCO-C numbers (NVlabs/FAN detection/configs/cascade_mask_fan_*_fpn_3x_mstrain_fp16.py), checked
piece by piece so that a later edit cannot drift from it silently; and one of them trained for 2
iterations on the toy set (slow tier).
"""
import re

import pytest
from mmengine.config import Config

from helpers import REPO, run_tool_here

CASCADES = {v: f'configs/fan/cascade-mask-rcnn_fan-{v}-hybrid_fpn_ms-3x_coco.py'
            for v in ('t', 's', 'b', 'l')}
PRETRAINED = {'t': 'fan_hybrid_tiny.pth.tar', 's': 'fan_hybrid_small.pth.tar',
              'b': 'fan_hybrid_base.pth.tar', 'l': 'fan_hybrid_large_in22k_1k.pth.tar'}
STAGE_STDS = [[0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1], [0.033, 0.033, 0.067, 0.067]]
SHORT_EDGES = list(range(480, 801, 32))


def _short_edges(resize: dict) -> list:
    assert resize['type'] == 'RandomChoiceResize' and resize['keep_ratio'], resize
    return sorted(min(s) for s in resize['scales'])


@pytest.mark.parametrize('variant', CASCADES)
def test_cascade_configs_carry_fans_recipe(variant):
    cfg = Config.fromfile(str(REPO / CASCADES[variant]))
    # the box heads: 4 shared convs + 1 fc with SyncBN, GIoU (weight 10) on decoded boxes
    heads = cfg.model.roi_head.bbox_head
    assert len(heads) == 3
    for head, stds in zip(heads, STAGE_STDS):
        assert head.type == 'ConvFCBBoxHead'
        assert (head.num_shared_convs, head.num_shared_fcs) == (4, 1)
        assert (head.conv_out_channels, head.fc_out_channels) == (256, 1024)
        assert head.norm_cfg.type == 'SyncBN'
        assert head.loss_bbox == dict(type='GIoULoss', loss_weight=10.0)
        assert head.reg_decoded_bbox is True and head.reg_class_agnostic is False
        assert head.bbox_coder.target_stds == stds
    # the backbone and its ImageNet weights (FAN-L: the released 22K-then-1K checkpoint)
    assert cfg.model.backbone.type == 'FANHybrid' and cfg.model.backbone.out_type == 'det'
    assert cfg.model.backbone.init_cfg.checkpoint == f'checkpoints/{PRETRAINED[variant]}'
    # FAN's detection backbones hard-code stochastic depth 0.3 (detection/models/fan.py)
    assert cfg.model.backbone.drop_path_rate == 0.3
    # DETR-style augmentation: multi-scale resize, or resize + absolute-range crop + resize
    pipeline = cfg.train_dataloader.dataset.pipeline
    kinds = [step['type'] for step in pipeline]
    assert kinds == ['LoadImageFromFile', 'LoadAnnotations', 'RandomFlip', 'RandomChoice',
                     'PackDetInputs']
    assert pipeline[1].with_mask and pipeline[2].prob == 0.5
    plain, cropped = pipeline[3].transforms
    assert len(plain) == 1 and _short_edges(plain[0]) == SHORT_EDGES
    assert [step['type'] for step in cropped] == ['RandomChoiceResize', 'RandomCrop',
                                                  'RandomChoiceResize']
    assert _short_edges(cropped[0]) == [400, 500, 600]
    assert (cropped[1].crop_type, tuple(cropped[1].crop_size)) == ('absolute_range', (384, 600))
    assert cropped[1].allow_negative_crop and _short_edges(cropped[2]) == SHORT_EDGES
    assert cfg.train_dataloader.dataset.type == 'CocoDataset'  # 36 real epochs, no repeat
    # AdamW 1e-4, wd 0.05, no decay on norms and position tables; 1 image per GPU on 32 GPUs
    optimizer = cfg.optim_wrapper.optimizer
    assert (optimizer.type, optimizer.lr, optimizer.weight_decay) == ('AdamW', 1e-4, 0.05)
    paramwise = cfg.optim_wrapper.paramwise_cfg
    assert paramwise.norm_decay_mult == 0.0
    assert paramwise.custom_keys['pos_embed'] == dict(decay_mult=0.0)
    assert cfg.train_dataloader.batch_size == 1
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=32)
    # 36 epochs, steps after 27 and 33, a linear warm-up over 500 iterations
    assert cfg.train_cfg.type == 'EpochBasedTrainLoop' and cfg.train_cfg.max_epochs == 36
    warmup, steps = cfg.param_scheduler
    assert (warmup.type, warmup.by_epoch, warmup.end) == ('LinearLR', False, 500)
    assert (steps.type, steps.milestones, steps.end) == ('MultiStepLR', [27, 33], 36)


@pytest.mark.parametrize('variant', CASCADES)
def test_cityscapes_segformers_use_fans_segmentation_backbones_stochastic_depth(variant):
    """FAN's segmentation backbones use no stochastic depth (no config of FAN's sets it)."""
    cfg = Config.fromfile(str(REPO / f'configs/fan/segformer_fan-{variant}-hybrid_8xb1-160k_'
                                     'cityscapes-1024x1024.py'))
    assert cfg.model.backbone.type == 'FANHybrid' and cfg.model.backbone.out_type == 'seg'
    assert cfg.model.backbone.drop_path_rate == 0.0
    assert cfg.model.backbone.arch == {'t': 'tiny', 's': 'small', 'b': 'base', 'l': 'large'}[
        variant]


@pytest.mark.slow
def test_a_cascade_recipe_trains_on_the_toy_set(toy_data, tmp_path, in_repo):
    """FAN-T's cascade config as it is trains 2 iterations on the toy set.

    FAN-T's cascade config as it is (its heads, augmentation and optimiser) on two toy images for
    one epoch: 2 iterations, finite losses; SyncBN runs as BN in one process.
    """
    work = tmp_path / 'work'
    root = toy_data['toy_coco']
    classes = "('circle','square','triangle','star','hexagon')"
    proc = run_tool_here(
        'train.py', CASCADES['t'], '--work-dir', work, '--cfg-options',
        'model.backbone.init_cfg=None', f'train_dataloader.dataset.data_root={root}/',
        f'val_dataloader.dataset.data_root={root}/', f'test_dataloader.dataset.data_root={root}/',
        f'val_evaluator.ann_file={root}/annotations/instances_val2017.json',
        f'test_evaluator.ann_file={root}/annotations/instances_val2017.json',
        'train_dataloader.dataset.indices=2', f'train_dataloader.dataset.metainfo.classes='
        f'{classes}', 'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
        'train_cfg.max_epochs=1', 'train_cfg.val_begin=1000', 'default_hooks.logger.interval=1',
        'default_hooks.checkpoint.interval=1000')
    log = next(work.rglob('*.log')).read_text()
    assert re.search(r'Epoch\(train\)\s+\[1\]\[2/2\]', log), proc.stdout[-3000:] + log[-3000:]
    losses = [float(v) for v in re.findall(r'\bloss: ([0-9.naninf]+)', log)]
    assert len(losses) == 2 and all(v == v and v < float('inf') for v in losses), losses
    assert 's2.loss_bbox' in log  # every cascade stage's GIoU loss
