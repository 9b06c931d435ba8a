# EfficientDet-Lite0 (configs/efficientdet/) trained from scratch on mmrobust's toy COCO, boxes
# only: minutes on a CPU. The plain baseline of ./efficientdet-lite0_dat_toy-coco.py.
_base_ = ['../efficientdet/_base_/efficientdet-lite0.py', '../_base_/toy_det_runtime.py']

model = dict(backbone=dict(init_cfg=None), bbox_head=dict(num_classes=5))
val_evaluator = dict(metric='bbox')
test_evaluator = val_evaluator
