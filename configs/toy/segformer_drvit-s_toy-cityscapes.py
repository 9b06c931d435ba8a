# SegFormer head on a Dr-ViT-S backbone (from scratch, random tokenizer) on mmrobust's toy
# Cityscapes: the CPU-sized version of configs/drvit/segformer_drvit-s_8xb1-160k_cityscapes-1024x1024.py.
# Load a trained tokenizer as explained in configs/toy/mask-rcnn_drvit-s_fpn_toy-coco.py.
_base_ = './segformer_mit-b0_toy-cityscapes.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='DrViT',
        arch='small',
        tokenizer=dict(type='VQGAN', arch=dict(
            ch=32, ch_mult=(1, 2, 2, 2, 2), num_res_blocks=1, attn_resolutions=(),
            resolution=256, z_channels=256, embed_dim=256, n_embed=256)),
        drop_path_rate=0.0,
        init_cfg=None),
    decode_head=dict(in_channels=[96, 192, 384, 384]))
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
