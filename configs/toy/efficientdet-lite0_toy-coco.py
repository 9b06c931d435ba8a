# EfficientDet-Lite0 (configs/efficientdet/) trained from scratch on mmrobust's toy COCO, boxes
# only: minutes on a CPU. The plain baseline of ./efficientdet-lite0_dat_toy-coco.py.
_base_ = [
    '../efficientdet/_base_/efficientdet-lite0.py',
    '../_base_/datasets/toy_coco_instance.py',
    '../_base_/schedules/toy_iter.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

model = dict(backbone=dict(init_cfg=None), bbox_head=dict(num_classes=5))
val_evaluator = dict(metric='bbox')
test_evaluator = val_evaluator
default_hooks = dict(
    logger=dict(interval=20),
    checkpoint=dict(by_epoch=False, interval=100, max_keep_ckpts=2))
auto_scale_lr = dict(enable=False, base_batch_size=2)
log_processor = dict(by_epoch=False)
randomness = dict(seed=0)  # reproducible toy runs
