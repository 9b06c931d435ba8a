# EfficientDet-Lite0: EfficientNet-Lite0 (no squeeze-excite, ReLU6) with D0's BiFPN and head,
# ReLU6 throughout; 320x320 inputs. 3.24M parameters with 90 classes.
_base_ = './efficientdet-d0.py'
act_cfg = dict(type='ReLU6')
model = dict(
    backbone=dict(
        _delete_=True,
        type='EfficientNetLite',
        arch='lite0',
        drop_path_rate=0.2,
        out_indices=(3, 4, 5),
        frozen_stages=0,
        norm_cfg={{_base_.norm_cfg}},
        norm_eval=False,
        # ImageNet EfficientNet-Lite0, loaded strictly: timm's tf_efficientnet_lite0 weights
        # as they are, or the output of tools/model_converters/convert_backbone.py --family
        # efficientnet-lite (TF / TF-Keras releases); see ../README.md
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/efficientnet-lite0_in1k.pth')),
    neck=dict(act_cfg=act_cfg),
    bbox_head=dict(act_cfg=act_cfg))
