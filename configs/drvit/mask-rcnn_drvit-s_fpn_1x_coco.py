# Mask R-CNN + FPN with a Dr-ViT-S backbone on COCO 2017 (1x).
# Tokenizer: taming's ImageNet VQGAN f16-1024 (put vqgan_imagenet_f16_1024.ckpt under
# checkpoints/; its Lightning file loads safely) or your own from tools/train_vq.py.
# Transformer: a timm / DeiT ViT-S checkpoint (checkpoints/deit_small_patch16_224.pth), or
# train from scratch with --cfg-options model.backbone.init_cfg=None.
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='DrViT',
        arch='small',
        tokenizer=dict(type='VQGAN', arch='f16_1024', init_cfg=dict(
            type='Pretrained', checkpoint='checkpoints/vqgan_imagenet_f16_1024.ckpt')),
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/deit_small_patch16_224.pth')),
    neck=dict(in_channels=[96, 192, 384, 384]))  # strides 4, 8, 16, 32
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.),
            # the codebook is fine-tuned at lr / 100, as in Dr-ViT
            'code_delta': dict(lr_mult=0.01, decay_mult=0.),
        }),
    clip_grad=dict(max_norm=1.0))
