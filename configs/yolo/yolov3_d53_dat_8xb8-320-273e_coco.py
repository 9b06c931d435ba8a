# YOLOv3-320 with Discrete Adversarial Training (paper: 20.55 mAP on COCO-C, +7.75% rPC over
# the plain model).
_base_ = ['./yolov3_d53_8xb8-320-273e_coco.py', '../_base_/dat/dat.py']
custom_hooks = [{{_base_.dat_hook}}]
