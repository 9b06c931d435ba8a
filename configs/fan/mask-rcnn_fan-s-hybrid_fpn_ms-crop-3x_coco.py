# Mask R-CNN + FPN with a FAN-S-Hybrid backbone on COCO 2017: AdamW lr 1e-4, wd 0.05 (none on
# norms, position encoding, class token and channel-attention temperatures), 3x schedule with
# multi-scale + crop augmentation (the Swin/FAN detection recipe).
# ImageNet weights: put fan_hybrid_small.pth.tar (NVlabs FAN release) under checkpoints/, or
# train from scratch with --cfg-options model.backbone.init_cfg=None.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py'
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

optim_wrapper = dict(
    paramwise_cfg=dict(
        _delete_=True,
        norm_decay_mult=0.,
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.),
            'temperature': dict(decay_mult=0.),
        }))
auto_scale_lr = dict(enable=False, base_batch_size=16)
