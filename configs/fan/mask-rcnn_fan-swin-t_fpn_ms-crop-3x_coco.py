# Mask R-CNN + FPN with a FAN-Swin-T backbone on COCO 2017 (Swin's 3x multi-scale + crop recipe,
# AdamW lr 1e-4, wd 0.05). Weights: see ./_base_/fan-swin.py.
_base_ = ['mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py', './_base_/fan-swin.py']
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

model = dict(backbone={{_base_.fan_swin_backbone}}, neck=dict(in_channels=[96, 192, 384, 768]))
optim_wrapper = dict(paramwise_cfg={{_base_.fan_swin_det_paramwise}})
auto_scale_lr = dict(enable=False, base_batch_size=16)
