# Mask R-CNN with a FAN-T-Hybrid backbone (from scratch) on mmrobust's toy COCO: the CPU-sized
# version of configs/fan/mask-rcnn_fan-s-hybrid_fpn_ms-crop-3x_coco.py.
_base_ = ['./mask-rcnn_r18_fpn_toy-coco.py', '../fan/_base_/fan-hybrid.py']

model = dict(
    backbone=dict(_delete_=True, type='FANHybrid', arch='tiny', out_type='det', init_cfg=None),
    # NOTE: from scratch, the FAN maps (std ~1.5, growing early in training) make a plain FPN's
    # outputs blow up within tens of iterations; GroupNorm in the FPN keeps them at unit scale
    neck=dict(in_channels=[128, 256, 192, 768],
              norm_cfg=dict(type='GN', num_groups=32, requires_grad=True)))
optim_wrapper = dict(paramwise_cfg={{_base_.fan_det_paramwise}})
