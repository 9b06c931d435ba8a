# What every toy detection config shares: mmrobust's toy COCO, a few hundred iterations on a
# CPU (./schedules/toy_iter.py) and mmdet's runtime with frequent logs and checkpoints, seeded.
_base_ = [
    './datasets/toy_coco_instance.py',
    './schedules/toy_iter.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

default_hooks = dict(
    logger=dict(interval=20),
    checkpoint=dict(by_epoch=False, interval=100, max_keep_ckpts=2))
auto_scale_lr = dict(enable=False, base_batch_size=2)
log_processor = dict(by_epoch=False)
randomness = dict(seed=0)  # reproducible toy runs
