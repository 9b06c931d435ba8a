# SegFormer (MiT-B0 + SegFormer head) trained from scratch on mmrobust's toy Cityscapes:
# a few minutes on a 2-core CPU. The stock-backbone baseline of the toy segmentation suite.
_base_ = ['mmseg::_base_/models/segformer_mit-b0.py', '../_base_/toy_seg_runtime.py']

crop_size = (256, 256)
norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    data_preprocessor=dict(size=crop_size),
    decode_head=dict(channels=128, norm_cfg=norm_cfg))

optim_wrapper = dict(paramwise_cfg=dict(custom_keys=dict(
    pos_block=dict(decay_mult=0.0), norm=dict(decay_mult=0.0), head=dict(lr_mult=10.0))))
