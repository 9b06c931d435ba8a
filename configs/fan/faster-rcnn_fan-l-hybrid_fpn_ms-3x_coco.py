# Faster R-CNN + FPN with FAN-L-Hybrid: large in place of the small backbone of
# ./faster-rcnn_fan-s-hybrid_fpn_ms-3x_coco.py.
_base_ = ['./faster-rcnn_fan-s-hybrid_fpn_ms-3x_coco.py', './_base_/fan-l-hybrid.py']
model = {{_base_.fan_variant_det}}
