# FAN-S-Hybrid settings shared by the COCO, Cityscapes and ADE20K configs of this folder.
# ImageNet weights: put fan_hybrid_small.pth.tar (NVlabs FAN release) under checkpoints/, or
# train from scratch with --cfg-options model.backbone.init_cfg=None.
fan_pretrained = 'checkpoints/fan_hybrid_small.pth.tar'
_fan = dict(
    _delete_=True,
    type='FANHybrid',
    arch='small',
    drop_path_rate=0.1,
    init_cfg=dict(type='Pretrained', checkpoint=fan_pretrained))
fan_det_backbone = dict(**_fan, out_type='det')  # 128@4, 256@8, 384@16, 768@32
fan_det_channels = [128, 256, 384, 768]
fan_seg_backbone = dict(**_fan, out_type='seg')  # 128@4, 256@8, 384@16, 384@16
fan_seg_channels = [128, 256, 384, 384]
# no weight decay on norms, the position encoding, the class token and the temperatures
# (merged into the base configs' own keys, which match no FAN parameter or say the same)
_no_decay = {
    'pos_embed': dict(decay_mult=0.),
    'cls_token': dict(decay_mult=0.),
    'temperature': dict(decay_mult=0.),
}
fan_det_paramwise = dict(norm_decay_mult=0., custom_keys=_no_decay)
# the SegFormer recipe also trains the head 10x faster
fan_seg_paramwise = dict(norm_decay_mult=0.,
                         custom_keys=dict(**_no_decay, head=dict(lr_mult=10.)))
