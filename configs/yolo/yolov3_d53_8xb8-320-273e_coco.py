# YOLOv3-320 (Darknet-53), mmdet's recipe unchanged: the plain baseline of
# ./yolov3_d53_dat_8xb8-320-273e_coco.py (DAT's paper trained this detector). Evaluate both with
# tools/test_robustness.py to compare their mPC / rPC.
_base_ = 'mmdet::yolo/yolov3_d53_8xb8-320-273e_coco.py'
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

# mmdet's ImageNet Darknet-53 (the file behind its `open-mmlab://darknet53`, which mmengine would
# download), from checkpoints/, loaded strictly (mmdet's own key layout)
model = dict(backbone=dict(init_cfg=dict(type='StrictPretrained',
                                         checkpoint='checkpoints/darknet53.pth')))
