# Mask R-CNN with a Dr-ViT-S backbone on mmrobust's toy COCO, from scratch: the CPU-sized
# version of configs/drvit/mask-rcnn_drvit-s_fpn_1x_coco.py. The tokenizer is random here; use
# one trained by `python tools/train_vq.py configs/tokenizers/vq-small-f16_toy-coco.py` with
# --cfg-options model.backbone.tokenizer.init_cfg.checkpoint=work_dirs/.../tokenizer.pth
# (and its arch).
_base_ = './mask-rcnn_r18_fpn_toy-coco.py'

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
    # NOTE: GroupNorm in the FPN, as for the toy FAN detector trained from scratch
    neck=dict(in_channels=[96, 192, 384, 384],
              norm_cfg=dict(type='GN', num_groups=32, requires_grad=True)))
optim_wrapper = dict(
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.),
            'code_delta': dict(lr_mult=0.01, decay_mult=0.),
        }))
