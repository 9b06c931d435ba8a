# Mask R-CNN + FPN with FAN-L-Hybrid: large in place of the small backbone of
# ./mask-rcnn_fan-s-hybrid_fpn_ms-crop-3x_coco.py.
_base_ = ['./mask-rcnn_fan-s-hybrid_fpn_ms-crop-3x_coco.py', './_base_/fan-l-hybrid.py']
model = {{_base_.fan_variant_det}}
