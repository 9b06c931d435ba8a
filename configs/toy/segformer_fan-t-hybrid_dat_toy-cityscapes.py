# Discrete Adversarial Training of the toy FAN-T-Hybrid SegFormer (the CPU-sized version of
# configs/fan/segformer_fan-s-hybrid_dat_8xb1-160k_cityscapes-1024x1024.py). Train the toy
# tokenizer first: python tools/train_vq.py configs/tokenizers/vq-small-f16_toy-coco.py
_base_ = ['./segformer_fan-t-hybrid_toy-cityscapes.py', '../_base_/dat/dat_toy.py']
custom_hooks = [{{_base_.dat_hook}}]
