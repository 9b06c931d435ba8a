# SegFormer head (embed 768) on a FAN-S-Hybrid backbone, Cityscapes 1024x1024 crops, 160k iters,
# AdamW lr 6e-5 wd 0.01, head lr x10, poly schedule, sliding-window test 1024 / stride 768
# (FAN's segmentation setting).
# ImageNet weights: put fan_hybrid_small.pth.tar (NVlabs FAN release) under checkpoints/, or
# train from scratch with --cfg-options model.backbone.init_cfg=None.
_base_ = 'mmseg::segformer/segformer_mit-b0_8xb1-160k_cityscapes-1024x1024.py'
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
        out_type='seg',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[128, 256, dims, dims], channels=768))

optim_wrapper = dict(
    paramwise_cfg=dict(
        _delete_=True,
        norm_decay_mult=0.,
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.),
            'temperature': dict(decay_mult=0.),
            'head': dict(lr_mult=10.),
        }))
auto_scale_lr = dict(enable=False, base_batch_size=8)
