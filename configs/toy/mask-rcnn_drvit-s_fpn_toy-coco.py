# Mask R-CNN with a Dr-ViT-S backbone on mmrobust's toy COCO, from scratch on the toy tokenizer
# (train it first: python tools/train_vq.py configs/tokenizers/vq-small-f16_toy-coco.py): the
# CPU-sized version of configs/drvit/mask-rcnn_drvit-s_fpn_1x_coco.py.
_base_ = ['./mask-rcnn_r18_fpn_toy-coco.py', '../drvit/_base_/drvit-s.py']

model = dict(
    backbone={{_base_.drvit_toy_backbone}},
    # NOTE: GroupNorm in the FPN, as for the toy FAN detector trained from scratch
    neck=dict(in_channels={{_base_.drvit_channels}},
              norm_cfg=dict(type='GN', num_groups=32, requires_grad=True)))
optim_wrapper = dict(paramwise_cfg={{_base_.drvit_det_paramwise}})
