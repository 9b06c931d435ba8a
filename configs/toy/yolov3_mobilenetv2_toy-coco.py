# YOLOv3-320 (MobileNetV2) trained from scratch on mmrobust's toy COCO: mmdet's model and
# augmentation recipe with the toy data and an iteration schedule, minutes on a CPU. The plain
# baseline of ./yolov3_mobilenetv2_dat_toy-coco.py.
_base_ = 'mmdet::yolo/yolov3_mobilenetv2_8xb24-320-300e_coco.py'
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

# ==== frequently modified ====
data_root = 'data/toy_coco/'
metainfo = dict(classes=('circle', 'square', 'triangle', 'star', 'hexagon'))
max_iters = 300

model = dict(backbone=dict(init_cfg=None), bbox_head=dict(num_classes=5))
train_dataloader = dict(
    batch_size=4,
    num_workers=1,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(times=1, dataset=dict(data_root=data_root, metainfo=metainfo)))
val_dataloader = dict(batch_size=1, num_workers=1,
                      dataset=dict(data_root=data_root, metainfo=metainfo))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator

train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters,
                 val_interval=max_iters)
optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=1e-3, weight_decay=0.05),
                     clip_grad=dict(max_norm=10.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(type='CosineAnnealingLR', by_epoch=False, begin=30, end=max_iters, eta_min=1e-5)
]
default_hooks = dict(
    logger=dict(interval=20),
    checkpoint=dict(by_epoch=False, interval=100, max_keep_ckpts=2))
auto_scale_lr = dict(enable=False, base_batch_size=4)
log_processor = dict(by_epoch=False)
randomness = dict(seed=0)  # reproducible toy runs
