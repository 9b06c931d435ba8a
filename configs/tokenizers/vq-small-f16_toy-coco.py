# A small f16 VQ tokenizer (1 res block per level, 32 filters, BatchNorm; ./_base_/) trained on
# the toy COCO images, unlabelled, with mmengine's Runner:
#   python tools/train.py configs/tokenizers/vq-small-f16_toy-coco.py     (or tools/train_vq.py)
#   bash tools/dist_train.sh configs/tokenizers/vq-small-f16_toy-coco.py 2      # DDP, --amp...
# About 9 minutes on 2 CPU cores; the result (work_dirs/vq-small-f16_toy-coco/tokenizer.pth) is
# what the toy DAT and Dr-ViT configs load.
_base_ = ['./_base_/vq-small-f16-toy.py']
custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)
default_scope = 'mmdet'  # where mmrobust registers its modules (mmseg works alike)

iters = 1500
# the images of any mmdet / mmseg config's dataloaders (labels are not read)
data_config = 'configs/toy/mask-rcnn_r18_fpn_toy-coco.py'
# Crops at 0.6-1.0 of the files' size: the toy detectors resize the ~300-px images to 256 px,
# and that is the scale DAT and Dr-ViT tokenize. MSE (the PSNR's own loss), Adam at 3e-4 with a
# cosine decay, and 300 iterations as a plain autoencoder before the codebook is initialised by
# k-means on its latents (ae_warmup): the model's autoencoder learns slowly at 1e-3, and codes
# picked from trained latents are used at once (held-out PSNR per seed: ./README.md).
scale_range = (0.6, 1.0)
model = dict(type='VQTokenizerTrainer',
             tokenizer=dict(type='VQGAN', arch={{_base_.toy_tokenizer_arch}}),
             recon_loss='mse', codebook_ema=0.0, gan_weight=0.0, dead_code_interval=50,
             ae_warmup=300, seed=0)
train_dataloader = dict(
    batch_size=8, num_workers=1, persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),
    dataset=dict(type='ImageCropsDataset', config=data_config, loader='train_dataloader',
                 crop_size=64, train=True, scale_range=scale_range))
# 16 held-out images, central 128-px crops at the middle of scale_range
val_dataloader = dict(
    batch_size=16, num_workers=0, persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'),
    dataset=dict(type='ImageCropsDataset', config=data_config, loader='val_dataloader',
                 crop_size=128, train=False, scale_range=scale_range, max_images=16))
val_evaluator = dict(type='VQReconstructionMetric')
train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters, val_interval=300)
val_cfg = dict(type='ValLoop')
# generator: encoder, quantiser (unless codebook_ema), decoder; discriminator: with gan_weight
optim_wrapper = dict(
    constructor='VQOptimWrapperConstructor',
    generator=dict(type='OptimWrapper',
                   optimizer=dict(type='Adam', lr=3e-4, betas=(0.9, 0.999), weight_decay=0.)),
    discriminator=dict(type='OptimWrapper',
                       optimizer=dict(type='Adam', lr=1e-3, betas=(0.9, 0.999))))
param_scheduler = [dict(type='CosineAnnealingLR', T_max=iters, eta_min=0., by_epoch=False,
                        begin=0, end=iters)]

default_hooks = dict(
    runtime_info=dict(type='RuntimeInfoHook'),
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', interval=300, by_epoch=False, max_keep_ckpts=2),
    sampler_seed=dict(type='DistSamplerSeedHook'))
custom_hooks = [dict(type='TokenizerExportHook')]
log_processor = dict(type='LogProcessor', window_size=50, by_epoch=False)
env_cfg = dict(cudnn_benchmark=False, dist_cfg=dict(backend='nccl'))
# two optimizers: DDP wraps the tokenizer and the discriminator separately
model_wrapper_cfg = dict(type='MMSeparateDistributedDataParallel', broadcast_buffers=False,
                         find_unused_parameters=False)
# NOTE: BatchNorm tokenizer (the toy arch): in DDP its statistics are those of the whole batch,
# so every rank trains (and keeps) the same tokenizer as one process on all the images would
sync_bn = 'torch'
randomness = dict(seed=0)
log_level = 'INFO'
load_from = None
resume = False
