# Mask R-CNN + FPN with Dr-ViT-Ti: tiny in place of the small backbone of
# ./mask-rcnn_drvit-s_fpn_1x_coco.py.
_base_ = ['./mask-rcnn_drvit-s_fpn_1x_coco.py', './_base_/drvit-ti.py']
model = {{_base_.drvit_variant_det}}
