# FAN-S-Hybrid SegFormer on Cityscapes with Discrete Adversarial Training. The
# tokenizer round trips run at the full 1024x1024 crop (one image per GPU), which is what makes
# DAT expensive at this size.
_base_ = [
    './segformer_fan-s-hybrid_8xb1-160k_cityscapes-1024x1024.py', '../_base_/dat/dat.py']
custom_hooks = [{{_base_.dat_hook}}]
