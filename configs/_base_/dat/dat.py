# Discrete Adversarial Training settings shared by the *_dat_* configs (mmrobust.DATHook).
# The reference code's choices: the latent-diffusion VQ-f8 tokenizer (16384 codes; put its
# model.ckpt at checkpoints/vq-f8.ckpt, it loads safely without Lightning), one L2-normalised
# gradient step of alpha = 0.1 in [0, 1] pixels, the perturbed reconstruction re-quantised, and
# clean + adversarial images trained together (mode='append'; 'replace' is the paper's
# Algorithm 1).
dat_tokenizer = dict(type='VQGAN', arch='f8_16384', chunk_size=8,
                     init_cfg=dict(type='Pretrained', checkpoint='checkpoints/vq-f8.ckpt'))
dat_hook = dict(type='DATHook', tokenizer=dat_tokenizer, alpha=0.1, eps=0.1, mode='append',
                requantize='reconstruction')
