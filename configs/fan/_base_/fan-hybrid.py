# Settings shared by every FAN-Hybrid config, whatever the variant (the COCO, Cityscapes and
# ADE20K configs of this folder and their CPU-sized versions in configs/toy/).
#
# No weight decay on norms, the position encoding, the class token and the channel-attention
# temperatures.
_no_decay = {
    'pos_embed': dict(decay_mult=0.),
    'cls_token': dict(decay_mult=0.),
    'temperature': dict(decay_mult=0.),
}
# merged into the detection bases' own paramwise settings (which match no FAN parameter)
fan_det_paramwise = dict(norm_decay_mult=0., custom_keys=_no_decay)
# the SegFormer recipe also trains the head 10x faster; it replaces the SegFormer bases' own
# keys (MiT's `pos_block` and `norm`, which say nothing else for FAN)
fan_seg_paramwise = dict(_delete_=True, norm_decay_mult=0.,
                         custom_keys=dict(**_no_decay, head=dict(lr_mult=10.)))
