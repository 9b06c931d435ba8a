# Discrete Adversarial Training of the toy FAN-T-Hybrid Mask R-CNN (the CPU-sized version of
# configs/fan/mask-rcnn_fan-s-hybrid_fpn_dat_ms-crop-3x_coco.py). Train the toy tokenizer first:
#   python tools/train_vq.py configs/tokenizers/vq-small-f16_toy-coco.py
_base_ = ['./mask-rcnn_fan-t-hybrid_fpn_toy-coco.py', '../_base_/dat/dat_toy.py']
custom_hooks = [{{_base_.dat_hook}}]
