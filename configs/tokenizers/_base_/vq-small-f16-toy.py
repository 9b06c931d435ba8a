# The toy tokenizer: a small f16 VQ model (1 res block per level, 32 filters, taming's channel
# multipliers; 1.4M encoder parameters), 256 codes. Narrower than Dr-ViT's small encoder
# (VQGAN arch 'small_f16', 64 filters) so that its full-resolution round trips, which DAT runs
# twice per step, stay cheap on a CPU. BatchNorm instead of taming's GroupNorm: trained from
# scratch on small crops, the GroupNorm model stayed below the mean-colour baseline for 1000+
# iterations (see the norm option of VQGAN). Trained by ../vq-small-f16_toy-coco.py; the toy
# DAT and Dr-ViT configs load its result from here.
toy_tokenizer_arch = dict(ch=32, ch_mult=(1, 1, 2, 2, 4), num_res_blocks=1, attn_resolutions=(),
                          resolution=256, z_channels=256, embed_dim=256, n_embed=256,
                          norm='batch')
toy_tokenizer_checkpoint = 'work_dirs/vq-small-f16_toy-coco/tokenizer.pth'
