# Faster R-CNN + FPN with FAN-B-Hybrid: base in place of the small backbone of
# ./faster-rcnn_fan-s-hybrid_fpn_ms-3x_coco.py.
_base_ = ['./faster-rcnn_fan-s-hybrid_fpn_ms-3x_coco.py', './_base_/fan-b-hybrid.py']
model = {{_base_.fan_variant_det}}
