# Dr-ViT-Ti in place of Dr-ViT-S (ViT-Ti: width 192, 3 heads; discrete tokens only, the 256-d
# codes projected to 192, as the paper does for Ti), merged into a Dr-ViT-S config's `model`.
# Transformer weights: a timm / DeiT ViT-Ti checkpoint (deit_tiny_patch16_224.pth) under
# checkpoints/; tokenizer: as ./drvit-s.py.
_backbone = dict(arch='tiny',
                 init_cfg=dict(checkpoint='checkpoints/deit_tiny_patch16_224.pth'))
drvit_variant_det = dict(backbone=_backbone, neck=dict(in_channels=[48, 96, 192, 192]))
drvit_variant_seg = dict(backbone=_backbone, decode_head=dict(in_channels=[48, 96, 192, 192]))
