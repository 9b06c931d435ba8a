# The EfficientDet paper's COCO recipe (data, schedule, runtime; the model comes from
# ./efficientdet-*.py): scale jitter 0.1-2.0 then a square crop, SGD lr 0.16 for 128 images
# (8 GPUs x 16), momentum 0.9, weight decay 4e-5 (not on norms and biases), one warm-up epoch
# then cosine decay over 300 epochs, gradient clipping at 10, an EMA of the weights.
_base_ = ['mmdet::_base_/datasets/coco_detection.py', 'mmdet::_base_/default_runtime.py']

image_size = (512, 512)
max_epochs = 300


def _pipelines(size):
    """The recipe's train and test pipelines at a square input size."""
    train = [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations', with_bbox=True),
        dict(type='RandomResize', scale=size, ratio_range=(0.1, 2.0), keep_ratio=True),
        dict(type='RandomCrop', crop_size=size),
        dict(type='RandomFlip', prob=0.5),
        dict(type='PackDetInputs')
    ]
    test = [
        dict(type='LoadImageFromFile'),
        dict(type='Resize', scale=size, keep_ratio=True),
        dict(type='LoadAnnotations', with_bbox=True),
        dict(type='PackDetInputs',
             meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
    ]
    return train, test


train_pipeline, test_pipeline = _pipelines(image_size)
# NOTE: a config at another size takes these (a child's image_size does not re-run this file)
train_pipeline_320, test_pipeline_320 = _pipelines((320, 320))
train_dataloader = dict(batch_size=16, num_workers=8, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=10)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(
    optimizer=dict(type='SGD', lr=0.16, momentum=0.9, weight_decay=4e-5),
    paramwise_cfg=dict(norm_decay_mult=0., bias_decay_mult=0.),
    clip_grad=dict(max_norm=10, norm_type=2))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=1, end=max_epochs, T_max=max_epochs - 1,
         eta_min=0., convert_to_iter_based=True)
]
ema_hook = dict(type='EMAHook', ema_type='ExpMomentumEMA', momentum=0.0002,
                update_buffers=True, priority=49)
custom_hooks = [ema_hook]
default_hooks = dict(checkpoint=dict(interval=10, max_keep_ckpts=3))
auto_scale_lr = dict(enable=False, base_batch_size=128)
# SyncBN across the GPUs (the configs set it on the backbone, BiFPN and head)
sync_bn = dict(type='SyncBN', momentum=0.01, eps=1e-3, requires_grad=True)
