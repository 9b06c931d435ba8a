# mmrobust's toy COCO (instance segmentation): `python data/generate_toy_data.py` writes it.
# Same layout and annotation format as COCO 2017, five shape classes, 256-320 px images.
_base_ = 'mmdet::_base_/datasets/coco_instance.py'

data_root = 'data/toy_coco/'
metainfo = dict(
    classes=('circle', 'square', 'triangle', 'star', 'hexagon'),
    palette=[(220, 20, 60), (255, 160, 0), (0, 160, 60), (0, 90, 230), (160, 0, 200)])

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(256, 256), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(256, 256), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
train_dataloader = dict(
    batch_size=2,
    num_workers=1,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=train_pipeline,
                 filter_cfg=dict(filter_empty_gt=True, min_size=8)))
val_dataloader = dict(
    num_workers=1,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator
