# SegFormer head on a Dr-ViT-S backbone (from scratch, the toy tokenizer) on mmrobust's toy
# Cityscapes: the CPU-sized version of
# configs/drvit/segformer_drvit-s_8xb1-160k_cityscapes-1024x1024.py.
_base_ = ['./segformer_mit-b0_toy-cityscapes.py', '../drvit/_base_/drvit-s.py']

model = dict(backbone={{_base_.drvit_toy_backbone}},
             decode_head=dict(in_channels={{_base_.drvit_channels}}))
optim_wrapper = dict(paramwise_cfg={{_base_.drvit_seg_paramwise}})
