# Faster R-CNN + FPN with FAN-S-Hybrid on COCO 2017 (3x schedule, multi-scale 480-800, AdamW
# lr 1e-4 wd 0.05).
# ImageNet weights: put fan_hybrid_small.pth.tar (NVlabs FAN release) under checkpoints/, or
# train from scratch with --cfg-options model.backbone.init_cfg=None.
_base_ = [
    'mmdet::common/ms_3x_coco.py',
    'mmdet::_base_/models/faster-rcnn_r50_fpn.py',
]
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

# ==== frequently modified ====
arch = 'small'
pretrained = 'checkpoints/fan_hybrid_small.pth.tar'
dims = {'tiny': 192, 'small': 384, 'base': 448, 'large': 480}[arch]

model = dict(
    backbone=dict(
        _delete_=True,
        type='FANHybrid',
        arch=arch,
        out_type='det',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[128, 256, dims, 768]))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomResize', scale=[(1333, 480), (1333, 800)], keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
train_dataloader = dict(dataset=dict(dataset=dict(pipeline=train_pipeline)))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.),
            'temperature': dict(decay_mult=0.),
        }))
auto_scale_lr = dict(enable=False, base_batch_size=16)
