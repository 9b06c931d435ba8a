# Faster R-CNN + FPN with FAN-S-Hybrid on COCO 2017 (3x schedule, multi-scale 480-800, AdamW
# lr 1e-4 wd 0.05).
_base_ = ['mmdet::_base_/models/faster-rcnn_r50_fpn.py', './_base_/fan-s-hybrid_ms-3x_coco.py']

model = {{_base_.fan_det_model}}
