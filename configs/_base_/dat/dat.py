# Discrete Adversarial Training settings shared by the *_dat_* configs (mmrobust.DATHook).
# The reference code's choices, all of them: the latent-diffusion VQ-f8 tokenizer (16384 codes;
# put its model.ckpt at checkpoints/vq-f8.ckpt, it loads safely without Lightning); a random
# start on the eps-sphere around the reconstruction in 80% of the batches (one coin per batch);
# one L2-normalised gradient step of alpha = 0.1, the total change capped at eps = 0.1, both L2
# norms over the whole image in [0, 1] pixels (budget='image'); the perturbed reconstruction
# re-quantised; clean + adversarial images trained together with equal weights (mode='append';
# 'replace' is the paper's Algorithm 1). DATHook's own defaults differ (no random start,
# mode='replace'): they are the paper's algorithm, this file is the reference's code.
dat_tokenizer = dict(type='VQGAN', arch='f8_16384', chunk_size=8,
                     init_cfg=dict(type='Pretrained', checkpoint='checkpoints/vq-f8.ckpt'))
dat_hook = dict(type='DATHook', tokenizer=dat_tokenizer, alpha=0.1, eps=0.1, budget='image',
                norm='l2', random_start=True, random_start_prob=0.8, mode='append',
                requantize='reconstruction')
