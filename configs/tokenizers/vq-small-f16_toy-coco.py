# A small f16 VQ tokenizer (1 res block per level, 32 filters, BatchNorm; ./_base_/) trained on
# the toy COCO images, unlabelled:
#   python tools/train_vq.py configs/tokenizers/vq-small-f16_toy-coco.py
# About 5 minutes on 2 CPU cores; the result (work_dirs/vq-small-f16_toy-coco/tokenizer.pth) is
# what the toy DAT and Dr-ViT configs load.
_base_ = ['./_base_/vq-small-f16-toy.py']
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

model = dict(type='VQGAN', arch={{_base_.toy_tokenizer_arch}})
# the images of any mmdet / mmseg config's dataloaders (labels are not read)
data = dict(config='configs/toy/mask-rcnn_r18_fpn_toy-coco.py', train='train_dataloader',
            val='val_dataloader')
# Crops at 0.6-1.0 of the files' size: the toy detectors resize the ~300-px images to 256 px,
# and that is the scale DAT and Dr-ViT tokenize. MSE (the PSNR's own loss), Adam's usual betas
# and a cosine decay: 18.5 dB in 1500 iterations, where 2000 at a constant rate gave 18.3.
train = dict(iters=1500, batch_size=8, crop_size=64, scale_range=(0.6, 1.0), eval_crop_size=128,
             lr=1e-3, lr_schedule='cosine', betas=(0.9, 0.999), recon_loss='mse', num_workers=1,
             dead_code_interval=50, preview_interval=300, checkpoint_interval=300,
             eval_images=16)
