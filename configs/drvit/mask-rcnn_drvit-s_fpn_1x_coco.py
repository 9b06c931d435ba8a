# Mask R-CNN + FPN with a Dr-ViT-S backbone on COCO 2017 (1x), AdamW lr 1e-4.
# Weights: see ./_base_/drvit-s.py.
_base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py', './_base_/drvit-s.py']
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

model = dict(backbone={{_base_.drvit_backbone}}, neck=dict(in_channels={{_base_.drvit_channels}}))
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg={{_base_.drvit_det_paramwise}},
    clip_grad=dict(max_norm=1.0))
