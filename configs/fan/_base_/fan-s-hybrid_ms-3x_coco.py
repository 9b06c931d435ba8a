# Faster R-CNN with FAN-S-Hybrid on COCO 2017: mmdet's 3x schedule with multi-scale training
# 480-800 and FAN's optimiser (AdamW lr 1e-4 wd 0.05). A config adds its detector's model base
# and sets `model.backbone` / `model.neck.in_channels` from ./fan-s-hybrid.py. (The Cascade
# Mask R-CNN configs carry FAN's full detection recipe: ../cascade-mask-rcnn_*.py.)
_base_ = ['mmdet::common/ms_3x_coco.py', './fan-s-hybrid.py']
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomResize', scale=[(1333, 480), (1333, 800)], keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
train_dataloader = dict(dataset=dict(dataset=dict(pipeline=train_pipeline)))

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg={{_base_.fan_det_paramwise}})
auto_scale_lr = dict(enable=False, base_batch_size=16)
