# SegFormer head (embed 768) on a FAN-S-Hybrid backbone, Cityscapes 1024x1024 crops, 160k iters,
# AdamW lr 6e-5 wd 0.01, head lr x10, poly schedule, sliding-window test 1024 / stride 768
# and no stochastic depth (FAN's segmentation setting).
_base_ = [
    'mmseg::segformer/segformer_mit-b0_8xb1-160k_cityscapes-1024x1024.py',
    './_base_/fan-s-hybrid.py',
]
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

model = {{_base_.fan_paper_seg_model}}  # FAN's drop_path_rate 0 (its segmentation backbones')
optim_wrapper = {{_base_.fan_seg_optim_wrapper}}
auto_scale_lr = dict(enable=False, base_batch_size=8)
