# Mask R-CNN + FPN with FAN-Swin-B (C = 128, depths 2-2-18-2, drop path 0.3 as Swin-B): base in
# place of the tiny backbone of ./mask-rcnn_fan-swin-t_fpn_ms-crop-3x_coco.py.
_base_ = './mask-rcnn_fan-swin-t_fpn_ms-crop-3x_coco.py'
model = dict(backbone=dict(arch='base', drop_path_rate=0.3),
             neck=dict(in_channels=[128, 256, 512, 1024]))
