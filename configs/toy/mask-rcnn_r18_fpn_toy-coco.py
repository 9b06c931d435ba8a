# Mask R-CNN (ResNet-18 + FPN, 128-channel heads) trained from scratch on mmrobust's toy COCO:
# a few minutes on a 2-core CPU, box/mask AP clearly above zero. The stock-backbone baseline
# of the toy suite.
#   python data/generate_toy_data.py
#   python tools/train.py configs/toy/mask-rcnn_r18_fpn_toy-coco.py
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', '../_base_/toy_det_runtime.py']

# ==== frequently modified ====
num_classes = 5
channels = 128  # FPN and head width (256 in the COCO configs)

model = dict(
    backbone=dict(
        depth=18,
        frozen_stages=-1,  # trained from scratch: nothing to freeze
        norm_eval=False,
        init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512], out_channels=channels),
    rpn_head=dict(in_channels=channels, feat_channels=channels),
    roi_head=dict(
        # NOTE: a fixed sampling ratio; the adaptive default (0) makes CPU RoIAlign the bottleneck
        bbox_roi_extractor=dict(
            roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=2),
            out_channels=channels),
        bbox_head=dict(in_channels=channels, fc_out_channels=512, num_classes=num_classes),
        mask_roi_extractor=dict(
            roi_layer=dict(type='RoIAlign', output_size=14, sampling_ratio=2),
            out_channels=channels),
        mask_head=dict(in_channels=channels, conv_out_channels=channels, num_convs=2,
                       num_classes=num_classes)),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=1000, max_per_img=500),
        rcnn=dict(sampler=dict(num=64))),
    # NOTE: a toy image holds at most 5 objects: 20 detections (COCO's 100) cost the trained
    # demo 0.002 box and 0.001 mask AP (0.181 / 0.253 -> 0.179 / 0.252) and save a fourth of its
    # test time, a third of an untrained model's (whose every class scores above 0.05): the
    # mask head runs on each detection
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=300), rcnn=dict(max_per_img=20)))
