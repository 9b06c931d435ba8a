# Dr-ViT-S settings shared by the COCO / Cityscapes configs of this folder and their toy
# versions in configs/toy/. Tokenizer: taming's ImageNet VQGAN f16-1024 (put
# vqgan_imagenet_f16_1024.ckpt under checkpoints/; its Lightning file loads safely) or your own
# from tools/train_vq.py. Transformer: a timm / DeiT ViT-S checkpoint, or train from scratch
# with --cfg-options model.backbone.init_cfg=None.
_base_ = ['../../tokenizers/_base_/vq-small-f16-toy.py']
_drvit = dict(_delete_=True, type='DrViT', arch='small')
drvit_backbone = dict(
    **_drvit,
    tokenizer=dict(type='VQGAN', arch='f16_1024', init_cfg=dict(
        type='Pretrained', checkpoint='checkpoints/vqgan_imagenet_f16_1024.ckpt')),
    drop_path_rate=0.1,
    init_cfg=dict(type='Pretrained', checkpoint='checkpoints/deit_small_patch16_224.pth'))
# CPU-sized: the project's toy tokenizer (train it first with
# `python tools/train_vq.py configs/tokenizers/vq-small-f16_toy-coco.py`), no pretrained
# transformer
drvit_toy_backbone = dict(
    **_drvit,
    tokenizer=dict(type='VQGAN', arch={{_base_.toy_tokenizer_arch}}, init_cfg=dict(
        type='Pretrained', checkpoint={{_base_.toy_tokenizer_checkpoint}})),
    drop_path_rate=0.0,
    init_cfg=None)
drvit_channels = [96, 192, 384, 384]  # strides 4, 8, 16, 32
# no weight decay on norms, position embedding and class token; the codebook is fine-tuned at
# lr / 100, as in Dr-ViT
_keys = {
    'pos_embed': dict(decay_mult=0.),
    'cls_token': dict(decay_mult=0.),
    'code_delta': dict(lr_mult=0.01, decay_mult=0.),
}
drvit_det_paramwise = dict(norm_decay_mult=0., custom_keys=_keys)
# the SegFormer recipe also trains the head 10x faster
drvit_seg_paramwise = dict(_delete_=True, norm_decay_mult=0.,
                           custom_keys=dict(**_keys, head=dict(lr_mult=10.)))
