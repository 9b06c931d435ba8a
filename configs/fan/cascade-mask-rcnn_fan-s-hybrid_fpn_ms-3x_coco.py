# Cascade Mask R-CNN + FPN with FAN-S-Hybrid on COCO 2017, FAN's recipe: the setting of its
# published COCO / COCO-C numbers (NVlabs/FAN detection/configs/cascade_mask_fan_*_fpn_3x_
# mstrain_fp16.py, an mmdet 2.x config), written in mmdet 3.x terms:
# - box heads: 4 shared convs + 1 fc with SyncBN (ConvFCBBoxHead), GIoU loss (weight 10) on
#   decoded boxes, in each of the three stages;
# - DETR-style augmentation: a random choice of a multi-scale resize (short edge 480-800) or a
#   resize (400-600), a random crop (384-600) and a multi-scale resize;
# - AdamW lr 1e-4, weight decay 0.05 (none on norms, position encoding, class token and
#   channel-attention temperatures), 1 image per GPU on 32 GPUs (FAN's 4-node command:
#   `auto_scale_lr` scales the lr to another GPU count with --auto-scale-lr), 36 epochs with the
#   lr divided by 10 after epochs 27 and 33, a linear warm-up over 500 iterations;
# - stochastic depth 0.3 (FAN's detection backbones hard-code it);
# - fp16: train with --amp (FAN trained with apex's fp16).
_base_ = [
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
    './_base_/fan-s-hybrid.py',
]
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)


def _box_head(target_stds):
    return dict(
        type='ConvFCBBoxHead',
        num_shared_convs=4,
        num_shared_fcs=1,
        in_channels=256,
        conv_out_channels=256,
        fc_out_channels=1024,
        roi_feat_size=7,
        num_classes=80,
        bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.],
                        target_stds=target_stds),
        reg_class_agnostic=False,
        reg_decoded_bbox=True,  # NOTE: GIoU is a loss on boxes, not on deltas
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
        loss_bbox=dict(type='GIoULoss', loss_weight=10.0))


model = dict(
    backbone={{_base_.fan_paper_det_backbone}},  # FAN's drop_path_rate 0.3
    neck=dict(in_channels={{_base_.fan_det_channels}}),
    roi_head=dict(bbox_head=[
        _box_head([0.1, 0.1, 0.2, 0.2]),
        _box_head([0.05, 0.05, 0.1, 0.1]),
        _box_head([0.033, 0.033, 0.067, 0.067]),
    ]))

_scales = [(1333, s) for s in range(480, 801, 32)]  # short edge 480, 512, ..., 800
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomChoice', transforms=[
        [dict(type='RandomChoiceResize', scales=_scales, keep_ratio=True)],
        [
            dict(type='RandomChoiceResize', scales=[(1333, 400), (1333, 500), (1333, 600)],
                 keep_ratio=True),
            dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600),
                 allow_negative_crop=True),
            dict(type='RandomChoiceResize', scales=_scales, keep_ratio=True),
        ],
    ]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(batch_size=1, dataset=dict(pipeline=train_pipeline))

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33],
         gamma=0.1),
]
optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg={{_base_.fan_det_paramwise}})
auto_scale_lr = dict(enable=False, base_batch_size=32)
