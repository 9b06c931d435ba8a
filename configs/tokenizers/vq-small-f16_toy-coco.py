# A small f16 VQ tokenizer (1 res block per level, 32 filters; ./_base_/) trained on the toy COCO
# images, unlabelled: `python tools/train_vq.py configs/tokenizers/vq-small-f16_toy-coco.py`.
# A few minutes on a CPU; the result (work_dirs/vq-small-f16_toy-coco/tokenizer.pth) is what the
# toy DAT configs load.
_base_ = ['./_base_/vq-small-f16-toy.py']
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)

model = dict(type='VQGAN', arch={{_base_.toy_tokenizer_arch}})
# the images of any mmdet / mmseg config's dataloaders (labels are not read)
data = dict(config='configs/toy/mask-rcnn_r18_fpn_toy-coco.py', train='train_dataloader',
            val='val_dataloader')
train = dict(iters=600, batch_size=8, crop_size=64, lr=4e-4, num_workers=1,
             dead_code_interval=50, preview_interval=200, checkpoint_interval=200,
             eval_images=16)
