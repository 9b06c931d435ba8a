# EfficientDet-Lite0 on COCO 2017: D0's recipe at 320x320 (DAT's paper: 27.3 mAP with DAT,
# 17.89 on COCO-C).
_base_ = ['./_base_/efficientdet-lite0.py', './_base_/coco_300e.py']
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

image_size = (320, 320)
model = dict(backbone=dict(norm_cfg={{_base_.sync_bn}}), neck=dict(norm_cfg={{_base_.sync_bn}}),
             bbox_head=dict(norm_cfg={{_base_.sync_bn}}))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomResize', scale=image_size, ratio_range=(0.1, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=image_size),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
