# SegFormer head with Dr-ViT-Ti: tiny in place of the small backbone of
# ./segformer_drvit-s_8xb1-160k_cityscapes-1024x1024.py.
_base_ = ['./segformer_drvit-s_8xb1-160k_cityscapes-1024x1024.py', './_base_/drvit-ti.py']
model = {{_base_.drvit_variant_seg}}
