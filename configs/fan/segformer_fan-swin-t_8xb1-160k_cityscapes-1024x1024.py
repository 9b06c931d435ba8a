# SegFormer head (embed 768) on a FAN-Swin-T backbone, Cityscapes 1024x1024 crops, 160k iters,
# AdamW lr 6e-5 wd 0.01, head lr x10, poly schedule, sliding-window test 1024 / stride 768 (FAN's
# segmentation setting). Weights: see ./_base_/fan-swin.py.
_base_ = [
    'mmseg::segformer/segformer_mit-b0_8xb1-160k_cityscapes-1024x1024.py',
    './_base_/fan-swin.py',
]
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

model = dict(backbone={{_base_.fan_swin_backbone}},
             decode_head=dict(in_channels=[96, 192, 384, 768], channels=768))
optim_wrapper = dict(paramwise_cfg={{_base_.fan_swin_seg_paramwise}})
auto_scale_lr = dict(enable=False, base_batch_size=8)
