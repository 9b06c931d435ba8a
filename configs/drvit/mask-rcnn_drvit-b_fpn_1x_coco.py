# Mask R-CNN + FPN with Dr-ViT-B: base in place of the small backbone of
# ./mask-rcnn_drvit-s_fpn_1x_coco.py.
_base_ = ['./mask-rcnn_drvit-s_fpn_1x_coco.py', './_base_/drvit-b.py']
model = {{_base_.drvit_variant_det}}
