"""Training a VQ tokenizer (Dr-ViT's stage 1, DAT's discretizer) with mmengine's Runner.

:class:`VQTokenizerTrainer` wraps a :class:`VQGAN` as an mmengine model, so the tokenizer
trains with ``tools/train.py`` / ``tools/dist_train.sh`` like any detector: devices, DDP,
``--amp``, ``--resume``, logging and checkpoints come from mmengine. Its ``train_step`` updates
the generator (encoder, quantiser, decoder) and, with ``gan_weight > 0``, a PatchGAN
discriminator, each through its own optimizer of an ``OptimWrapperDict`` (as OpenMMLab's GAN
trainers do).

The loss is the standard VQ-VAE loss (reconstruction + ``|sg[z] - e|^2 + beta |z - sg[e]|^2``,
straight-through), optionally with the PatchGAN term. The codebook is learned by that loss or,
with ``codebook_ema``, by exponential moving averages. Unused codes are restarted from encoder
outputs every ``dead_code_interval`` iterations; the codebook starts from encoder outputs.

Layout of the checkpoints: ``tokenizer.*`` is the VQGAN, ``loss.*`` the training state
(discriminator, EMA statistics, code usage), as in taming's checkpoints, so
``VQGAN(init_cfg=dict(type='Pretrained', checkpoint=...))`` loads a Runner checkpoint directly
and strictly. The pieces around it: :class:`~mmrobust.engine.VQOptimWrapperConstructor` (the
optimizers), :class:`~mmrobust.evaluation.VQReconstructionMetric` (held-out PSNR, perplexity,
used codes) and :class:`~mmrobust.engine.TokenizerExportHook` (``tokenizer.pth``, ``eval.json``
and reconstruction previews in the work dir).
"""
import logging
import math
from typing import Dict, List, Optional, Union

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from mmengine.logging import MessageHub, print_log
from mmengine.model import BaseModel
from mmengine.optim import OptimWrapper, OptimWrapperDict
from typing_extensions import override

from ...registry import MODELS
from ..utils import unwrap_model

__all__ = ['VQTokenizerTrainer', 'PatchDiscriminator', 'psnr', 'code_stats', 'ema_update']


# -- pieces ----------------------------------------------------------------------------------------

class PatchDiscriminator(nn.Module):
    """A small PatchGAN (for the optional adversarial term)."""

    def __init__(self, width: int = 64, layers: int = 3) -> None:
        super().__init__()
        mods: List[nn.Module] = [nn.Conv2d(3, width, 4, 2, 1), nn.LeakyReLU(0.2)]
        chs = width
        for _ in range(1, layers):
            mods += [nn.Conv2d(chs, chs * 2, 4, 2, 1), nn.GroupNorm(8, chs * 2), nn.LeakyReLU(0.2)]
            chs *= 2
        mods.append(nn.Conv2d(chs, 1, 4, 1, 1))
        self.net = nn.Sequential(*mods)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x * 2 - 1)


def psnr(sq_err_sum: float, count: float) -> float:
    """PSNR (dB) of [0, 1] images from a summed squared error over ``count`` values."""
    mse = sq_err_sum / max(count, 1)
    return float('inf') if mse == 0 else 10 * math.log10(1.0 / mse)


def code_stats(counts: torch.Tensor) -> Dict[str, float]:
    """Perplexity and number of used codes of a code histogram."""
    probs = counts.float() / counts.sum().clamp(min=1)
    entropy = -(probs[probs > 0] * probs[probs > 0].log()).sum()
    return {'perplexity': float(entropy.exp()), 'used_codes': int((counts > 0).sum())}


@torch.no_grad()
def ema_update(codebook: torch.Tensor, cluster_size: torch.Tensor, embed_sum: torch.Tensor,
               counts: torch.Tensor, sums: torch.Tensor, decay: float, eps: float = 1e-5) -> None:
    """The VQ-VAE codebook update by exponential moving averages.

    Van den Oord et al. 2017, appendix. Each code becomes the running mean of the latents assigned
    to it. ``counts`` / ``sums`` are this step's per-code assignment counts and latent sums (all
    ranks summed).
    """
    cluster_size.mul_(decay).add_(counts, alpha=1 - decay)
    embed_sum.mul_(decay).add_(sums, alpha=1 - decay)
    # NOTE: Laplace smoothing, so codes that lose all their latents do not divide by ~0
    n = cluster_size.sum()
    size = (cluster_size + eps) / (n + len(codebook) * eps) * n
    codebook.copy_(embed_sum / size[:, None])


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class _TrainingState(nn.Module):
    """What training keeps besides the tokenizer (checkpointed under ``loss.``).

    Its forward is the discriminator's, so that DDP syncs the discriminator's gradients.
    """

    def __init__(self, n_embed: int, embed_dim: int, gan: bool, ema: bool,
                 bank_size: int = 0) -> None:
        super().__init__()
        self.discriminator = PatchDiscriminator() if gan else None
        self.register_buffer('usage', torch.zeros(n_embed, dtype=torch.long))
        self.register_buffer('codebook_ready', torch.zeros((), dtype=torch.bool))
        if bank_size:  # the autoencoder warm-up's latest latents, for the k-means init
            self.register_buffer('bank', torch.zeros(bank_size, embed_dim))
            self.register_buffer('bank_filled', torch.zeros((), dtype=torch.long))
        if ema:
            self.register_buffer('ema_cluster_size', torch.ones(n_embed))
            self.register_buffer('ema_embed_sum', torch.zeros(n_embed, embed_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.discriminator(x)


# -- the model -------------------------------------------------------------------------------------

@MODELS.register_module()
class VQTokenizerTrainer(BaseModel):
    """A VQ tokenizer as an mmengine model.

    ``train_step`` with generator and discriminator optimizers, ``val_step`` for
    :class:`VQReconstructionMetric`.

    Args:
        tokenizer: config of the :class:`VQGAN` to train.
        recon_loss: ``'l1'`` or ``'mse'`` (the PSNR's own loss).
        codebook_ema: decay of the EMA codebook update (e.g. 0.99); 0 learns the codebook by
            the loss.
        gan_weight: weight of the PatchGAN term (0: no discriminator).
        gan_start: first iteration with the PatchGAN term.
        dead_code_interval: restart the codes unused in the last this many iterations (0: never);
            the window's perplexity and used codes are logged then.
        ae_warmup: train this many iterations as a plain autoencoder (the quantiser bypassed),
            then initialise the codebook by k-means on the encoder's latest latents (0: the
            codebook starts from random latents of the untrained encoder). A code grid picked
            from trained latents is used from the first quantised step, where codes of the
            untrained encoder go stale as it learns.
        kmeans_iters: Lloyd iterations of that initialisation.
        zero_init_output: start the decoder's last convolution at zero (a tokenizer trained
            from scratch; a ``checkpoint`` / ``init_cfg`` of the tokenizer config is loaded
            over it). Its reconstruction then starts as flat grey instead of the random
            colour field of an untrained decoder. The toy recipe leaves it off: it helped two
            of three seeds and sank the third below the mean-colour baseline
            (docs/en/notes/benchmarks.md).
        seed: seeds the code restarts and the k-means per iteration (a resumed run restarts the
            same codes).
        data_preprocessor: moves the [0, 1] image batch to the device.
    """

    def __init__(self, tokenizer: dict, recon_loss: str = 'l1', codebook_ema: float = 0.0,
                 gan_weight: float = 0.0, gan_start: int = 0, dead_code_interval: int = 100,
                 ae_warmup: int = 0, kmeans_iters: int = 10, zero_init_output: bool = False,
                 seed: int = 0, data_preprocessor: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor or dict(type='BaseDataPreprocessor'),
                         init_cfg=init_cfg)
        if recon_loss not in ('l1', 'mse'):
            raise ValueError(f"VQTokenizerTrainer: recon_loss must be 'l1' or 'mse', got "
                             f'{recon_loss!r}')
        if codebook_ema and not 0 < codebook_ema < 1:
            raise ValueError(f'VQTokenizerTrainer: codebook_ema must be in (0, 1) (or 0 to learn '
                             f'the codebook by the loss), got {codebook_ema}')
        if ae_warmup < 0 or kmeans_iters < 1:
            raise ValueError(f'VQTokenizerTrainer: ae_warmup must be >= 0 and kmeans_iters >= 1, '
                             f'got {ae_warmup} and {kmeans_iters}')
        self.tokenizer = MODELS.build(tokenizer)
        tok = self.tokenizer
        if zero_init_output:
            if tokenizer.get('checkpoint'):  # NOTE: loaded in the constructor, kept
                print_log('zero_init_output: the tokenizer was loaded from a checkpoint; its '
                          'decoder keeps the loaded weights', logger='current',
                          level=logging.WARNING)
            else:  # an init_cfg checkpoint, loaded by init_weights() later, replaces it
                nn.init.zeros_(tok.decoder.conv_out.weight)
                nn.init.zeros_(tok.decoder.conv_out.bias)
        # NOTE: 4 latents per code, so that k-means has enough points to place every code
        self.loss = _TrainingState(tok.n_embed, tok.embed_dim, gan_weight > 0, codebook_ema > 0,
                                   bank_size=4 * tok.n_embed if ae_warmup else 0)
        self.ae_warmup, self.kmeans_iters = int(ae_warmup), int(kmeans_iters)
        if codebook_ema:  # NOTE: moved by its averages; no gradient, not an optimizer parameter
            tok.quantize.embedding.weight.requires_grad_(False)
        self.recon_loss, self.codebook_ema = recon_loss, float(codebook_ema)
        self.gan_weight, self.gan_start = float(gan_weight), int(gan_start)
        self.dead_code_interval, self.seed = int(dead_code_interval), int(seed)
        self._warned_warmup_val = False

    # -- helpers -----------------------------------------------------------------------------------
    @property
    def vqgan(self) -> nn.Module:
        """The tokenizer, unwrapped from DDP."""
        return unwrap_model(self.tokenizer)

    @property
    def state(self) -> _TrainingState:
        """The training state (discriminator, EMA), unwrapped from DDP."""
        return unwrap_model(self.loss)

    @property
    def codebook(self) -> torch.Tensor:
        """The tokenizer's codebook (n_embed, embed_dim)."""
        return self.vqgan.quantize.embedding.weight

    def generator_parameters(self) -> List[nn.Parameter]:
        """What the generator optimizer updates: the tokenizer, without an EMA codebook."""
        return [p for p in self.vqgan.parameters() if p.requires_grad]

    @torch.no_grad()
    def restart_codes(self, index: torch.Tensor, images: torch.Tensor, it: int) -> None:
        """Move codes ``index`` to random encoder outputs of ``images`` (slightly jittered).

        Drawn from (seed, iteration); in DDP rank 0's draw goes to every rank.
        """
        vq = self.vqgan
        z = vq.encode_latent(images).permute(0, 2, 3, 1).reshape(-1, vq.embed_dim)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + it)
        pick = z[torch.randint(len(z), (len(index), ), generator=gen).to(z.device)]
        pick = pick + 1e-3 * torch.randn(pick.shape, generator=gen).to(z.device)
        if _world() > 1:  # NOTE: every rank restarts at the same iterations: the call pairs up
            dist.broadcast(pick, 0)
        self.codebook[index] = pick.to(self.codebook.dtype)
        if self.codebook_ema:
            self.state.ema_embed_sum[index] = pick
            self.state.ema_cluster_size[index] = 1.0

    @torch.no_grad()
    def _bank_latents(self, z: torch.Tensor) -> None:
        """Keep the latest latents of the warm-up (first in, first out)."""
        state = self.state
        flat = z.detach().float().permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        flat = flat[-len(state.bank):]
        state.bank.copy_(torch.cat([state.bank[len(flat):], flat]))
        state.bank_filled.add_(len(flat)).clamp_(max=len(state.bank))

    @torch.no_grad()
    def kmeans_init(self, images: torch.Tensor, it: int) -> None:
        """The codebook as k-means centroids of the banked latents (plus this batch's).

        k-means starts from a seeded k-means++ draw; an emptied cluster takes a random latent. In
        DDP rank 0's codebook goes to every rank.
        """
        state, vq = self.state, self.vqgan
        points = torch.cat([state.bank[len(state.bank) - int(state.bank_filled):],
                            vq.encode_latent(images).permute(0, 2, 3, 1).reshape(
                                -1, vq.embed_dim)]).float()
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + it)
        k = len(self.codebook)
        # k-means++ start: each next centroid drawn with probability ~ squared distance to the
        # nearest one so far (a uniform start leaves clusters to share a centroid)
        first = int(torch.randint(len(points), (1, ), generator=gen))
        centroids = points[first:first + 1]
        nearest = torch.cdist(points, centroids).squeeze(1).pow(2)
        for _ in range(k - 1):
            weights = nearest.cpu() + 1e-12
            pick = int(torch.multinomial(weights / weights.sum(), 1, generator=gen))
            centroids = torch.cat([centroids, points[pick:pick + 1]])
            nearest = torch.minimum(nearest, (points - points[pick]).pow(2).sum(1))
        for _ in range(self.kmeans_iters):
            assign = torch.cdist(points, centroids).argmin(1)
            counts = torch.bincount(assign, minlength=k).float()
            sums = torch.zeros_like(centroids).index_add_(0, assign, points)
            empty = counts == 0
            centroids = torch.where(empty[:, None], centroids, sums / counts.clamp(min=1)[:, None])
            if empty.any():
                pick = torch.randint(len(points), (int(empty.sum()), ), generator=gen)
                centroids[empty] = points[pick.to(points.device)]
        if _world() > 1:  # NOTE: every rank initialises at the same iteration: the call pairs up
            dist.broadcast(centroids, 0)
        self.codebook.copy_(centroids.to(self.codebook.dtype))
        if self.codebook_ema:
            self.state.ema_embed_sum.copy_(centroids)
            self.state.ema_cluster_size.fill_(1.0)
        # the bank has served (each rank banked its own latents; only rank 0's counted): empty,
        # so that every rank's state is the same from here on
        state.bank.zero_()
        state.bank_filled.zero_()

    def _ema_step(self, z: torch.Tensor, codes: torch.Tensor) -> None:
        flat = z.detach().float().permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        idx = codes.flatten()
        counts = torch.bincount(idx, minlength=len(self.codebook)).float()
        sums = torch.zeros_like(self.state.ema_embed_sum).index_add_(0, idx, flat)
        if _world() > 1:  # NOTE: one codebook for all ranks: the statistics of all of them
            dist.all_reduce(counts)
            dist.all_reduce(sums)
        ema_update(self.codebook.data, self.state.ema_cluster_size, self.state.ema_embed_sum,
                   counts, sums, self.codebook_ema)

    # -- training ----------------------------------------------------------------------------------
    @override
    def train_step(self, data: Union[dict, tuple, list],
                   optim_wrapper: Union[OptimWrapper, OptimWrapperDict]) -> Dict[str, torch.Tensor]:
        images = self.data_preprocessor(data, True)['inputs']
        it = int(MessageHub.get_current_instance().get_info('iter', 0))
        warming = it < self.ae_warmup
        if not warming and not bool(self.state.codebook_ready):
            if self.ae_warmup:
                self.kmeans_init(images, it)
            else:  # NOTE: from encoder outputs, or all latents pick one code
                self.restart_codes(torch.arange(len(self.codebook)), images, it)
            self.state.codebook_ready.fill_(True)
        gen_opt = optim_wrapper['generator'] if isinstance(optim_wrapper, OptimWrapperDict) \
            else optim_wrapper
        latents: Dict[str, torch.Tensor] = {}
        handle = self.vqgan.quantize.register_forward_hook(
            lambda mod, args, out: latents.update(z=args[0])) \
            if self.codebook_ema or warming else None
        gan_on = self.state.discriminator is not None and it >= self.gan_start and not warming
        with gen_opt.optim_context(self.tokenizer):
            recon, vq_loss, codes = self.tokenizer(images, quantize=not warming)
            recon_fn = F.l1_loss if self.recon_loss == 'l1' else F.mse_loss
            loss = recon_fn(recon.float(), images) + vq_loss
            gan_loss = torch.zeros((), device=images.device)
            if gan_on:
                gan_loss = -self.loss(recon).mean()
                loss = loss + self.gan_weight * gan_loss
        if handle is not None:
            handle.remove()
        gen_opt.update_params(loss)
        log = {'loss': loss.detach(), 'vq_loss': vq_loss.detach(), 'gan_loss': gan_loss.detach()}
        if warming:
            self._bank_latents(latents['z'])
            return {'loss': loss.detach(), 'vq_loss': vq_loss.detach(),
                    'gan_loss': gan_loss.detach()}
        if self.codebook_ema:
            self._ema_step(latents['z'], codes)
        if gan_on:
            disc_opt = optim_wrapper['discriminator']
            disc_opt.zero_grad()  # NOTE: the generator's pass left gradients in it
            with disc_opt.optim_context(self.loss):
                # one forward for real and fake (GroupNorm is per sample): one DDP reduction
                real, fake = self.loss(torch.cat([images, recon.detach()])).chunk(2)
                d_loss = F.relu(1 - real).mean() + F.relu(1 + fake).mean()
            disc_opt.update_params(d_loss)
            log['disc_loss'] = d_loss.detach()
        usage = torch.bincount(codes.flatten(), minlength=len(self.codebook))
        if _world() > 1:
            dist.all_reduce(usage)
        self.state.usage += usage
        if self.dead_code_interval and (it + 1) % self.dead_code_interval == 0:
            dead = (self.state.usage == 0).nonzero().flatten()
            if len(dead):
                self.restart_codes(dead, images, it)
            stats = code_stats(self.state.usage)
            self.state.usage.zero_()
            log.update(dead_codes_reset=torch.tensor(float(len(dead))),
                       window_perplexity=torch.tensor(stats['perplexity']),
                       window_used_codes=torch.tensor(float(stats['used_codes'])))
        return log

    # -- evaluation --------------------------------------------------------------------------------
    @torch.no_grad()
    def val_step(self, data: Union[dict, tuple, list]) -> List[dict]:
        """Per image: squared error of the reconstruction and of two trivial baselines.

        The image's mean colour; its blur to the code grid. And its codes.

        During the autoencoder warm-up (``ae_warmup``, before the codebook is initialised) the
        reconstruction is the autoencoder's, the quantiser bypassed: through the codebook it
        would measure codes that do not exist yet. The log says which it is.
        """
        images = self.data_preprocessor(data, False)['inputs']
        vq = self.vqgan
        latents = vq.encode_latent(images)  # NOTE: once, for the codes and either reconstruction
        codes = vq.quantize.indices(latents)
        if self.ae_warmup and not bool(self.state.codebook_ready):
            if not self._warned_warmup_val:
                print_log('validation during the autoencoder warm-up: vq/psnr is the '
                          'reconstruction with the quantiser bypassed (no codebook yet); '
                          'codes and perplexity are those of the uninitialised codebook',
                          logger='current', level=logging.INFO)
                self._warned_warmup_val = True
            recon = vq.decode_latent(latents)
        else:
            recon = vq.decode(codes).clamp(0, 1)
        mean = images.mean(dim=(2, 3), keepdim=True).expand_as(images)
        blur = F.interpolate(F.avg_pool2d(images, vq.factor), size=images.shape[-2:],
                             mode='bilinear', align_corners=False)
        self.last_preview = (images[:8].cpu(), recon[:8].cpu())
        outs = []
        for i in range(len(images)):
            outs.append(dict(
                values=images[i].numel(), codes=codes[i].flatten().cpu(),
                **{f'sq_err_{name}': float((ref[i].clamp(0, 1) - images[i]).pow(2).sum())
                   for name, ref in (('recon', recon), ('mean_image', mean), ('blur', blur))}))
        return outs

    @override
    def test_step(self, data: Union[dict, tuple, list]) -> List[dict]:
        return self.val_step(data)

    def forward(self, inputs: torch.Tensor, data_samples=None, mode: str = 'tensor'):
        """The reconstruction of ``inputs`` ([0, 1] images).

        Training goes through :meth:`train_step`.
        """
        return self.vqgan.reconstruct(inputs)
