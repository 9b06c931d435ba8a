# EfficientDet-Lite0 with Discrete Adversarial Training (the EMA hook kept).
_base_ = ['./efficientdet-lite0_8xb16-300e_coco.py', '../_base_/dat/dat.py']
custom_hooks = [{{_base_.ema_hook}}, {{_base_.dat_hook}}]
