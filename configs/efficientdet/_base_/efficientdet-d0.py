# EfficientDet-D0 (Tan et al., CVPR 2020): EfficientNet-B0 P3-P5 -> BiFPN (64 channels, 3 layers,
# P6/P7 by pooling) -> class/box nets (3 separable-conv layers, BN per level, 9 anchors).
# 3.87M parameters with COCO's 80 classes (the paper's 3.9M counts 90). The model only: the
# COCO and toy configs add data and schedules.
act_cfg = dict(type='Swish')
norm_cfg = dict(type='BN', momentum=0.01, eps=1e-3, requires_grad=True)  # TF's BN momentum .99
model = dict(
    type='RetinaNet',  # mmdet's single-stage detector: backbone -> neck -> dense head
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_size_divisor=128),  # P7's stride
    backbone=dict(
        type='EfficientNet',
        arch='b0',
        drop_path_rate=0.2,
        out_indices=(3, 4, 5),  # P3-P5: 40, 112, 320 channels
        frozen_stages=0,
        norm_cfg=norm_cfg,
        norm_eval=False,
        # ImageNet EfficientNet-B0 (mmpretrain's efficientnet-b0_3rdparty_8xb32-aa-advprop_in1k,
        # whose `backbone.` keys are mmdet's EfficientNet's), loaded strictly
        init_cfg=dict(type='StrictPretrained', prefix='backbone',
                      checkpoint='checkpoints/efficientnet-b0_in1k.pth')),
    neck=dict(type='BiFPN', in_channels=[40, 112, 320], out_channels=64, num_layers=3,
              num_outs=5, norm_cfg=norm_cfg, act_cfg=act_cfg),
    bbox_head=dict(type='EfficientDetHead', num_classes=80, in_channels=64, feat_channels=64,
                   stacked_convs=3, norm_cfg=norm_cfg, act_cfg=act_cfg),
    train_cfg=dict(
        assigner=dict(type='MaxIoUAssigner', pos_iou_thr=0.5, neg_iou_thr=0.5, min_pos_iou=0,
                      ignore_iof_thr=-1),
        sampler=dict(type='PseudoSampler'),
        allowed_border=-1,
        pos_weight=-1,
        debug=False),
    test_cfg=dict(nms_pre=1000, min_bbox_size=0, score_thr=0.05,
                  nms=dict(type='nms', iou_threshold=0.5), max_per_img=100))
