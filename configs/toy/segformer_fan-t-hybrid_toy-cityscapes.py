# SegFormer head on a FAN-T-Hybrid backbone (from scratch) on mmrobust's toy Cityscapes: the
# CPU-sized version of configs/fan/segformer_fan-s-hybrid_8xb1-160k_cityscapes-1024x1024.py.
_base_ = ['./segformer_mit-b0_toy-cityscapes.py', '../fan/_base_/fan-hybrid.py']

model = dict(
    backbone=dict(_delete_=True, type='FANHybrid', arch='tiny', out_type='seg', init_cfg=None),
    decode_head=dict(in_channels=[128, 256, 192, 192]))
optim_wrapper = dict(paramwise_cfg={{_base_.fan_seg_paramwise}})
