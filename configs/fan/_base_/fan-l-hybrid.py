# FAN-L-Hybrid in place of FAN-S-Hybrid (C = 480, 22 FAN blocks, 10 heads; 76.86M parameters
# with the ImageNet head), merged into a FAN-S-Hybrid config's `model`. ImageNet weights: put
# fan_hybrid_large_in22k_1k.pth.tar (NVlabs FAN release) under checkpoints/.
_backbone = dict(arch='large',
                 init_cfg=dict(checkpoint='checkpoints/fan_hybrid_large_in22k_1k.pth.tar'))
fan_variant_det = dict(backbone=_backbone, neck=dict(in_channels=[128, 256, 480, 768]))
fan_variant_seg = dict(backbone=_backbone, decode_head=dict(in_channels=[128, 256, 480, 480]))
