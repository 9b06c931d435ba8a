# Two-stage detectors with FAN-S-Hybrid on COCO 2017, FAN's detection setting: 3x schedule,
# multi-scale training 480-800, AdamW lr 1e-4 wd 0.05. A config adds its detector's model base
# and sets `model.backbone` / `model.neck.in_channels` from ./fan-s-hybrid.py.
_base_ = ['mmdet::common/ms_3x_coco.py', './fan-s-hybrid.py']
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

_ms_train = [
    dict(type='RandomResize', scale=[(1333, 480), (1333, 800)], keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    *_ms_train,
]
# for detectors with a mask head: masks loaded in training and testing (as mmdet's
# common/ms_3x_coco-instance.py does)
fan_ms_mask_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    *_ms_train,
]
fan_mask_test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='Resize', scale=(1333, 800), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
train_dataloader = dict(dataset=dict(dataset=dict(pipeline=train_pipeline)))

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg={{_base_.fan_det_paramwise}})
auto_scale_lr = dict(enable=False, base_batch_size=16)
