# FAN-S-Hybrid Mask R-CNN + FPN on COCO 2017, 3x multi-scale (the headline FAN detector):
#   python tools/train.py configs/fan_hybrid_maskrcnn.py
_base_ = './fan/mask-rcnn_fan-s-hybrid_fpn_ms-crop-3x_coco.py'
