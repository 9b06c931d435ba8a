# FAN-T-Hybrid in place of FAN-S-Hybrid (C = 192, 8 FAN blocks, 8 heads; 7.47M parameters
# with the ImageNet head), merged into a FAN-S-Hybrid config's `model`. ImageNet weights: put
# fan_hybrid_tiny.pth.tar (NVlabs FAN release) under checkpoints/.
_backbone = dict(arch='tiny', init_cfg=dict(checkpoint='checkpoints/fan_hybrid_tiny.pth.tar'))
fan_variant_det = dict(backbone=_backbone, neck=dict(in_channels=[128, 256, 192, 768]))
fan_variant_seg = dict(backbone=_backbone, decode_head=dict(in_channels=[128, 256, 192, 192]))
