# Dr-ViT-B in place of Dr-ViT-S (ViT-B: width 768, 12 heads; [pixel 32 | code 256 | zeros]
# tokens), merged into a Dr-ViT-S config's `model`. Transformer weights: a timm / DeiT ViT-B
# checkpoint (deit_base_patch16_224.pth) under checkpoints/; tokenizer: as ./drvit-s.py.
_backbone = dict(arch='base',
                 init_cfg=dict(checkpoint='checkpoints/deit_base_patch16_224.pth'))
drvit_variant_det = dict(backbone=_backbone, neck=dict(in_channels=[192, 384, 768, 768]))
drvit_variant_seg = dict(backbone=_backbone, decode_head=dict(in_channels=[192, 384, 768, 768]))
