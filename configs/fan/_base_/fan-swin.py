# FAN-Swin settings shared by this folder's FAN-Swin configs (Mask R-CNN on COCO, SegFormer head
# on Cityscapes). No FAN-Swin ImageNet weights were released: train `FANSwin(out_type='cls')`
# on ImageNet and point `model.backbone.init_cfg` at it (dict(type='Pretrained',
# checkpoint=PATH), loaded strictly through FANSwin's checkpoint filter), or train from scratch.
fan_swin_backbone = dict(
    _delete_=True,
    type='FANSwin',
    arch='tiny',
    drop_path_rate=0.2,
    init_cfg=None)
# No weight decay on norms, relative position biases and channel-attention temperatures.
_no_decay = {
    'relative_position_bias_table': dict(decay_mult=0.),
    'temperature': dict(decay_mult=0.),
}
fan_swin_det_paramwise = dict(_delete_=True, norm_decay_mult=0., custom_keys=_no_decay)
# the SegFormer recipe also trains the head 10x faster
fan_swin_seg_paramwise = dict(_delete_=True, norm_decay_mult=0.,
                              custom_keys=dict(**_no_decay, head=dict(lr_mult=10.)))
