# YOLOv3-320 (Darknet-53), mmdet's recipe unchanged: the plain baseline of
# ./yolov3_d53_dat_8xb8-320-273e_coco.py (DAT's paper trained this detector). Evaluate both with
# tools/test_robustness.py to compare their mPC / rPC.
_base_ = 'mmdet::yolo/yolov3_d53_8xb8-320-273e_coco.py'
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)
