# EfficientDet-Lite0 on COCO 2017: D0's recipe at 320x320 (DAT's paper: 27.3 mAP with DAT,
# 17.89 on COCO-C).
_base_ = ['./_base_/efficientdet-lite0.py', './_base_/coco_300e.py']
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

image_size = (320, 320)
model = dict(backbone=dict(norm_cfg={{_base_.sync_bn}}), neck=dict(norm_cfg={{_base_.sync_bn}}),
             bbox_head=dict(norm_cfg={{_base_.sync_bn}}))
train_pipeline = {{_base_.train_pipeline_320}}
test_pipeline = {{_base_.test_pipeline_320}}
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
