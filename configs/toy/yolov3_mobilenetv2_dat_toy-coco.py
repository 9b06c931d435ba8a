# Discrete Adversarial Training of the toy YOLOv3-320 (the CPU-sized version of
# configs/yolo/yolov3_d53_dat_8xb8-320-273e_coco.py). Train the toy tokenizer first:
#   python tools/train_vq.py configs/tokenizers/vq-small-f16_toy-coco.py
_base_ = ['./yolov3_mobilenetv2_toy-coco.py', '../_base_/dat/dat_toy.py']
custom_hooks = [{{_base_.dat_hook}}]
