# FAN-B-Hybrid in place of FAN-S-Hybrid (C = 448, 16 FAN blocks, 8 heads; 50.48M parameters
# with the ImageNet head), merged into a FAN-S-Hybrid config's `model`. ImageNet weights: put
# fan_hybrid_base.pth.tar (NVlabs FAN release) under checkpoints/.
_backbone = dict(arch='base', init_cfg=dict(checkpoint='checkpoints/fan_hybrid_base.pth.tar'))
fan_variant_det = dict(backbone=_backbone, neck=dict(in_channels=[128, 256, 448, 768]))
fan_variant_seg = dict(backbone=_backbone, decode_head=dict(in_channels=[128, 256, 448, 448]))
