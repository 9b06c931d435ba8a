# SegFormer head on a Dr-ViT-S backbone, Cityscapes 1024x1024 crops, 160k iters (mmseg's
# SegFormer recipe: AdamW lr 6e-5, head lr x10, poly, sliding-window test).
# Tokenizer and transformer weights as in configs/drvit/mask-rcnn_drvit-s_fpn_1x_coco.py.
_base_ = 'mmseg::segformer/segformer_mit-b0_8xb1-160k_cityscapes-1024x1024.py'
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
    decode_head=dict(in_channels=[96, 192, 384, 384]))  # strides 4, 8, 16, 32
optim_wrapper = dict(
    paramwise_cfg=dict(
        _delete_=True,
        norm_decay_mult=0.,
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.),
            'code_delta': dict(lr_mult=0.01, decay_mult=0.),
            'head': dict(lr_mult=10.),
        }))
auto_scale_lr = dict(enable=False, base_batch_size=8)
