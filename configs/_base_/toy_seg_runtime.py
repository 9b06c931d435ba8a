# What every toy segmentation config shares: mmrobust's toy Cityscapes, a few hundred iterations
# on a CPU (./schedules/toy_iter.py) and mmseg's runtime with frequent logs and checkpoints,
# seeded.
_base_ = [
    './datasets/toy_cityscapes.py',
    './schedules/toy_iter.py',
    'mmseg::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

# mmseg keeps its default hooks in the schedule bases, which the toy configs do not use
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
