# SegFormer (MiT-B0 + SegFormer head) trained from scratch on mmrobust's toy Cityscapes:
# a few minutes on a 2-core CPU. The stock-backbone baseline of the toy segmentation suite.
_base_ = [
    'mmseg::_base_/models/segformer_mit-b0.py',
    '../_base_/datasets/toy_cityscapes.py',
    '../_base_/schedules/toy_iter.py',
    'mmseg::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

crop_size = (256, 256)
norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    data_preprocessor=dict(size=crop_size),
    decode_head=dict(channels=128, norm_cfg=norm_cfg))

optim_wrapper = dict(paramwise_cfg=dict(custom_keys=dict(
    pos_block=dict(decay_mult=0.0), norm=dict(decay_mult=0.0), head=dict(lr_mult=10.0))))
# mmseg keeps its default hooks in the schedule bases, which this config does not use
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=20, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=100, max_keep_ckpts=2),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
auto_scale_lr = dict(enable=False, base_batch_size=4)
log_processor = dict(by_epoch=False)
randomness = dict(seed=0)  # reproducible toy runs
