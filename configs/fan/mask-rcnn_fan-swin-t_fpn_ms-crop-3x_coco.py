# Mask R-CNN + FPN with a FAN-Swin-T backbone on COCO 2017 (Swin's 3x multi-scale + crop recipe,
# AdamW lr 1e-4, wd 0.05). No FAN-Swin weights were released: train your own ImageNet model with
# `FANSwin(out_type='cls')` and point init_cfg at it, or train from scratch.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py'
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='FANSwin',
        arch='tiny',
        drop_path_rate=0.2,
        init_cfg=None),
    neck=dict(in_channels=[96, 192, 384, 768]))

optim_wrapper = dict(
    paramwise_cfg=dict(
        _delete_=True,
        norm_decay_mult=0.,
        custom_keys={
            'relative_position_bias_table': dict(decay_mult=0.),
            'temperature': dict(decay_mult=0.),
        }))
auto_scale_lr = dict(enable=False, base_batch_size=16)
