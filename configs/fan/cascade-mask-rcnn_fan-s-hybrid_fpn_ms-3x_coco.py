# Cascade Mask R-CNN + FPN with FAN-S-Hybrid on COCO 2017: FAN's detection setting (3x schedule,
# multi-scale training 480-800, AdamW lr 1e-4 wd 0.05).
_base_ = [
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py',
    './_base_/fan-s-hybrid_ms-3x_coco.py',
]

model = {{_base_.fan_det_model}}
# masks in the pipelines too
train_dataloader = dict(dataset=dict(dataset=dict(pipeline={{_base_.fan_ms_mask_pipeline}})))
val_dataloader = dict(dataset=dict(pipeline={{_base_.fan_mask_test_pipeline}}))
test_dataloader = val_dataloader
