# Discrete Adversarial Training of the toy ResNet-18 Mask R-CNN (the README demo's detector), to
# compare with the plain one under tools/test_robustness.py. Train the toy tokenizer first:
#   python tools/train_vq.py configs/tokenizers/vq-small-f16_toy-coco.py
_base_ = ['./mask-rcnn_r18_fpn_toy-coco.py', '../_base_/dat/dat_toy.py']
custom_hooks = [{{_base_.dat_hook}}]
