# SegFormer head with FAN-Swin-B: base in place of the tiny backbone of
# ./segformer_fan-swin-t_8xb1-160k_cityscapes-1024x1024.py.
_base_ = './segformer_fan-swin-t_8xb1-160k_cityscapes-1024x1024.py'
model = dict(backbone=dict(arch='base', drop_path_rate=0.3),
             decode_head=dict(in_channels=[128, 256, 512, 1024]))
