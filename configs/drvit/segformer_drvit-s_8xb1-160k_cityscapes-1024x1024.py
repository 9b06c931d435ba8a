# SegFormer head on a Dr-ViT-S backbone, Cityscapes 1024x1024 crops, 160k iters (mmseg's
# SegFormer recipe: AdamW lr 6e-5, head lr x10, poly, sliding-window test).
# Weights: see ./_base_/drvit-s.py.
_base_ = ['mmseg::segformer/segformer_mit-b0_8xb1-160k_cityscapes-1024x1024.py',
          './_base_/drvit-s.py']
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

model = dict(backbone={{_base_.drvit_backbone}},
             decode_head=dict(in_channels={{_base_.drvit_channels}}))
optim_wrapper = dict(paramwise_cfg={{_base_.drvit_seg_paramwise}})
auto_scale_lr = dict(enable=False, base_batch_size=8)
