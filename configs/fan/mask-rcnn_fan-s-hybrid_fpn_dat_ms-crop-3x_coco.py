# FAN-S-Hybrid Mask R-CNN (3x multi-scale crop schedule) with Discrete Adversarial
# Training. Compare with the plain model through tools/test_robustness.py.
_base_ = ['./mask-rcnn_fan-s-hybrid_fpn_ms-crop-3x_coco.py', '../_base_/dat/dat.py']
custom_hooks = [{{_base_.dat_hook}}]
