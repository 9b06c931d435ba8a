# Discrete Adversarial Training of the toy EfficientDet-Lite0 (the CPU-sized version of
# configs/efficientdet/efficientdet-lite0_dat_8xb16-300e_coco.py). Train the toy tokenizer
# first: python tools/train_vq.py configs/tokenizers/vq-small-f16_toy-coco.py
_base_ = ['./efficientdet-lite0_toy-coco.py', '../_base_/dat/dat_toy.py']
custom_hooks = [{{_base_.dat_hook}}]
