# SegFormer head with FAN-T-Hybrid: tiny in place of the small backbone of
# ./segformer_fan-s-hybrid_8xb1-160k_cityscapes-1024x1024.py.
_base_ = ['./segformer_fan-s-hybrid_8xb1-160k_cityscapes-1024x1024.py', './_base_/fan-t-hybrid.py']
model = {{_base_.fan_variant_seg}}
