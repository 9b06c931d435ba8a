# EfficientDet-D0 on COCO 2017 at 512x512, the paper's recipe (./_base_/coco_300e.py).
_base_ = ['./_base_/efficientdet-d0.py', './_base_/coco_300e.py']
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

model = dict(backbone=dict(norm_cfg={{_base_.sync_bn}}), neck=dict(norm_cfg={{_base_.sync_bn}}),
             bbox_head=dict(norm_cfg={{_base_.sync_bn}}))
