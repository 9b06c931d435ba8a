# Cascade Mask R-CNN + FPN with FAN-S-Hybrid on COCO 2017: FAN's detection setting (3x schedule,
# multi-scale training 480-800, AdamW lr 1e-4 wd 0.05).
_base_ = [
    'mmdet::common/ms_3x_coco-instance.py',
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py',
    './_base_/fan-s-hybrid.py',
]
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

model = dict(
    backbone={{_base_.fan_det_backbone}},
    neck=dict(in_channels={{_base_.fan_det_channels}}))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomResize', scale=[(1333, 480), (1333, 800)], keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
train_dataloader = dict(dataset=dict(dataset=dict(pipeline=train_pipeline)))

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg={{_base_.fan_det_paramwise}})
auto_scale_lr = dict(enable=False, base_batch_size=16)
