# SegFormer head with FAN-B-Hybrid: base in place of the small backbone of
# ./segformer_fan-s-hybrid_8xb2-160k_ade20k-512x512.py.
_base_ = ['./segformer_fan-s-hybrid_8xb2-160k_ade20k-512x512.py', './_base_/fan-b-hybrid.py']
model = {{_base_.fan_variant_seg}}
