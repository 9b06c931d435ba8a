# The toy tokenizer: Dr-ViT's small f16 VQ model (1 res block per level, 64 filters), 256 codes.
# Trained by ../vq-small-f16_toy-coco.py; the toy DAT configs load its result from here.
toy_tokenizer_arch = dict(ch=64, ch_mult=(1, 2, 2, 2, 2), num_res_blocks=1, attn_resolutions=(),
                          resolution=256, z_channels=256, embed_dim=256, n_embed=256)
toy_tokenizer_checkpoint = 'work_dirs/vq-small-f16_toy-coco/tokenizer.pth'
