# FAN-S-Hybrid settings shared by the COCO, Cityscapes and ADE20K configs of this folder.
# ImageNet weights: put fan_hybrid_small.pth.tar (NVlabs FAN release) under checkpoints/, or
# train from scratch with --cfg-options model.backbone.init_cfg=None.
_base_ = './fan-hybrid.py'

fan_pretrained = 'checkpoints/fan_hybrid_small.pth.tar'
_fan = dict(
    _delete_=True,
    type='FANHybrid',
    arch='small',
    init_cfg=dict(type='Pretrained', checkpoint=fan_pretrained))
fan_det_backbone = dict(**_fan, out_type='det', drop_path_rate=0.1)  # 128@4, 256@8, 384@16, 768@32
fan_det_channels = [128, 256, 384, 768]
fan_seg_backbone = dict(**_fan, out_type='seg', drop_path_rate=0.1)  # 128@4, 256@8, 384@16, 384@16
fan_seg_channels = [128, 256, 384, 384]
# FAN's own stochastic depth, for the configs of its published numbers: its detection backbones
# hard-code drop_path_rate=0.3 (NVlabs/FAN detection/models/fan.py, all four hybrid variants),
# its segmentation backbones 0 (segmentation/mmseg/models/backbones/fan.py; no config sets it)
fan_paper_det_backbone = dict(**_fan, out_type='det', drop_path_rate=0.3)
fan_paper_seg_backbone = dict(**_fan, out_type='seg', drop_path_rate=0.0)
# merged into an mmdet FPN detector's / an mmseg SegFormer's `model` and `optim_wrapper`
fan_det_model = dict(backbone=fan_det_backbone, neck=dict(in_channels=fan_det_channels))
fan_seg_model = dict(backbone=fan_seg_backbone,
                     decode_head=dict(in_channels=fan_seg_channels, channels=768))
fan_paper_seg_model = dict(backbone=fan_paper_seg_backbone,
                           decode_head=dict(in_channels=fan_seg_channels, channels=768))
fan_det_optim_wrapper = dict(paramwise_cfg={{_base_.fan_det_paramwise}})
fan_seg_optim_wrapper = dict(paramwise_cfg={{_base_.fan_seg_paramwise}})
