# Mask R-CNN + FPN with a FAN-S-Hybrid backbone on COCO 2017: AdamW lr 1e-4, wd 0.05 (none on
# norms, position encoding, class token and channel-attention temperatures), 3x schedule with
# multi-scale + crop augmentation (the Swin/FAN detection recipe).
_base_ = ['mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py', './_base_/fan-s-hybrid.py']
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

model = {{_base_.fan_det_model}}
optim_wrapper = {{_base_.fan_det_optim_wrapper}}
auto_scale_lr = dict(enable=False, base_batch_size=16)
