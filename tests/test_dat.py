"""Discrete Adversarial Training (mmrobust.engine.DATHook) on toy detectors and segmentors."""
import copy
import random

import numpy as np
import pytest
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import MessageHub
from mmengine.registry import MODELS, init_default_scope
from mmengine.runner import Runner

from mmrobust.engine import DATHook
from mmrobust.models import VQGAN
from mmrobust.models.data_preprocessors import PixelSpace, valid_mask
from mmrobust.utils import safe_load

from helpers import REPO, free_port, run_cmd, run_ranks, run_tool_here
from helpers.cpu_sync_bn import SyncBatchNorm

DET_DAT = 'configs/toy/mask-rcnn_fan-t-hybrid_fpn_dat_toy-coco.py'
R18_DAT = 'configs/toy/mask-rcnn_r18_fpn_dat_toy-coco.py'
SEG_DAT = 'configs/toy/segformer_fan-t-hybrid_dat_toy-cityscapes.py'
SEG_PLAIN = 'configs/toy/segformer_mit-b0_toy-cityscapes.py'
NO_TOKENIZER_WEIGHTS = 'custom_hooks.0.tokenizer.init_cfg=None'


class ScalarQuantizer(nn.Module):
    """A transparent 'tokenizer': every pixel rounded to one of ``levels + 1`` values."""

    factor = 1

    def __init__(self, levels: int = 255) -> None:
        super().__init__()
        self.levels = levels

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.levels).round().long()

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return codes.float() / self.levels


def small_tokenizer(seed: int = 0) -> VQGAN:
    torch.manual_seed(seed)
    return VQGAN(arch=dict(ch=32, ch_mult=(1, 2, 2, 2, 2), num_res_blocks=1,
                           attn_resolutions=(), resolution=256, z_channels=256, embed_dim=256,
                           n_embed=256))


def toy_model(path: str, model_options: dict = None, batch_size: int = 2, seed: int = 0):
    """(model in train mode, one training batch) of a toy config."""
    cfg = Config.fromfile(str(REPO / path))
    if model_options:
        cfg.merge_from_dict(model_options)
    init_default_scope(cfg.default_scope)
    # NOTE: the batch's random crops and flips come from numpy's and random's global state
    np.random.seed(seed)
    random.seed(seed)
    torch.manual_seed(seed)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    loader = Runner.build_dataloader(dict(cfg.train_dataloader, num_workers=0,
                                          batch_size=batch_size, persistent_workers=False),
                                     seed=seed)
    return model, next(iter(loader))


def state(model: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope='module', params=[DET_DAT, SEG_DAT], ids=['detector', 'segmentor'])
def toy(request, toy_data):
    return (request.param, *toy_model(request.param))


def test_attack_pass_leaves_no_trace_and_logs(toy):
    path, model, batch = toy
    before = state(model)
    hook = DATHook(tokenizer=small_tokenizer(), mode='replace')
    hook.attach(model)
    try:
        clean = model.data_preprocessor.__class__.forward(model.data_preprocessor, batch, True)
        data = hook.attack_batch(batch, 0)
    finally:
        hook.detach()
    # parameters and every buffer (BN running statistics, counters) as before; no .grad
    after = state(model)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
    x_adv = data['inputs']
    assert x_adv.shape == clean['inputs'].shape and torch.isfinite(x_adv).all()
    space = hook.space
    x_hat, _ = hook.quantize(space.to_pixels(clean['inputs']))
    assert (space.to_pixels(x_adv) - x_hat).abs().mean() > 1e-4  # x_adv differs from Q(x)
    # padding (outside img_shape) is kept as the preprocessor made it
    for i, sample in enumerate(data['data_samples']):
        h, w = sample.img_shape[:2]
        assert torch.equal(x_adv[i, :, h:], clean['inputs'][i, :, h:])
        assert torch.equal(x_adv[i, :, :, w:], clean['inputs'][i, :, :, w:])
    stats = hook.last_stats
    assert set(stats) == {'dat_loss', 'dat_random_start', 'dat_delta', 'dat_codes_changed',
                          'dat_adv_l1', 'dat_nonfinite'}
    assert stats['dat_nonfinite'] == 0 and hook.skipped_nonfinite == 0
    assert stats['dat_random_start'] == 0  # the hook's default: no random start
    assert stats['dat_delta'] == pytest.approx(0.1, rel=1e-3)  # one L2 step of alpha
    assert 0 <= stats['dat_codes_changed'] <= 1 and stats['dat_loss'] > 0
    logged = MessageHub.get_current_instance().log_scalars
    assert logged['train/dat_loss'].current() == pytest.approx(stats['dat_loss'])
    # detached: the preprocessor is the plain one again
    assert 'forward' not in model.data_preprocessor.__dict__


def test_append_doubles_the_batch_with_consistent_samples(toy_data):
    model, batch = toy_model(DET_DAT)
    hook = DATHook(tokenizer=small_tokenizer(), mode='append')
    hook.attach(model)
    clean = type(model.data_preprocessor).forward(model.data_preprocessor, batch, True)
    data = hook.attack_batch(batch, 0)
    hook.detach()
    b = len(batch['inputs'])
    assert data['inputs'].shape[0] == 2 * b and len(data['data_samples']) == 2 * b
    assert torch.equal(data['inputs'][:b], clean['inputs'])
    for i in range(b):
        orig, copy_ = data['data_samples'][i], data['data_samples'][b + i]
        assert copy_ is not orig and copy_.metainfo == orig.metainfo
        assert torch.equal(copy_.gt_instances.bboxes, orig.gt_instances.bboxes)
        assert torch.equal(copy_.gt_instances.labels, orig.gt_instances.labels)
    losses = model(**data, mode='loss')
    assert torch.isfinite(model.parse_losses(losses)[0])


def _loss(model, x, samples, seed=0):
    torch.manual_seed(seed)  # the same dropout / sampling for every evaluation
    with torch.no_grad():
        return float(model.parse_losses(model(x, samples, mode='loss'))[0])


@pytest.mark.parametrize('norm,alpha', [('linf', 4 / 255), ('l2', 8.0)])
def test_adversarial_batch_raises_the_loss(norm, alpha, toy_data):
    """With a transparent tokenizer, x_adv = Q(x̂ + δ) raises the training loss on average."""
    gains = []
    for seed in range(3):
        model, batch = toy_model(SEG_PLAIN, seed=seed)
        hook = DATHook(tokenizer=ScalarQuantizer(), norm=norm, alpha=alpha, eps=alpha)
        hook.attach(model)
        clean = type(model.data_preprocessor).forward(model.data_preprocessor, batch, True)
        adv = hook.attack_batch(batch, seed)
        hook.detach()
        space = hook.space
        x_hat = space.from_pixels(hook.quantize(space.to_pixels(clean['inputs']))[0])
        gains.append(_loss(model, adv['inputs'], adv['data_samples'])
                     - _loss(model, x_hat, clean['data_samples']))
    assert sum(gains) / len(gains) > 0, gains


def test_gradients_equal_a_hand_written_dat_step(toy_data):
    no_dropout = {'model.backbone.drop_path_rate': 0.0, 'model.decode_head.dropout_ratio': 0.0}
    model, batch = toy_model(SEG_PLAIN, no_dropout, seed=1)
    # NOTE: a batch without padding: SegFormer's first LayerNorm sees zero-variance tokens in a
    # padded area, which scales float rounding up to 1e5-size gradients of the first conv's bias
    # (the plain step too), and the comparison below would test rounding, not the algorithm
    assert all(t.shape[-2:] == (256, 256) for t in batch['inputs'])
    reference = copy.deepcopy(model)
    tok = small_tokenizer()

    hook = DATHook(tokenizer=tok, mode='replace', alpha=0.1)
    hook.attach(model)
    data = hook.attack_batch(batch, 0)
    hook.detach()
    model.parse_losses(model(**data, mode='loss'))[0].backward()

    # Algorithm: x̂ = Q(x); g = dL/dx̂; δ = α g / |g|₂ (pixels in [0, 1]); x_adv = Q(x̂ + δ)
    data = reference.data_preprocessor(batch, True)
    x, samples = data['inputs'], data['data_samples']
    pre = reference.data_preprocessor
    assert pre.channel_conversion  # the toy configs feed RGB
    mean, std = pre.mean.view(1, 3, 1, 1), pre.std.view(1, 3, 1, 1)
    with torch.no_grad():
        x_hat = tok.decode(tok.encode((x * std + mean) / 255))
    x_in = ((x_hat * 255 - mean) / std).requires_grad_(True)
    loss = reference.parse_losses(reference(x_in, samples, mode='loss'))[0]
    g, = torch.autograd.grad(loss, x_in)
    g = g * 255 / std
    delta = 0.1 * g / g.flatten(1).norm(dim=1).view(-1, 1, 1, 1)
    with torch.no_grad():
        x_adv = tok.decode(tok.encode((x_hat + delta).clamp(0, 1)))
    reference.parse_losses(reference((x_adv * 255 - mean) / std, samples, mode='loss'))[0] \
        .backward()

    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_prob_start_iter_and_seeded_choices(toy_data):
    hook = DATHook(tokenizer=ScalarQuantizer(), prob=0.5, start_iter=3, seed=1)
    assert not any(hook.is_active(i) for i in range(3))
    draws = [hook.is_active(i) for i in range(3, 203)]
    assert 70 < sum(draws) < 130
    # the same choices after a resume (a fresh hook)
    assert draws == [DATHook(tokenizer=ScalarQuantizer(), prob=0.5, start_iter=3,
                             seed=1).is_active(i) for i in range(3, 203)]
    model, batch = toy_model(SEG_PLAIN)
    off = DATHook(tokenizer=ScalarQuantizer(), prob=0.0)
    off.attach(model)
    out = off.attack_batch(batch, 0)
    off.detach()
    clean = model.data_preprocessor(batch, True)
    assert torch.equal(out['inputs'], clean['inputs']) and not off.last_stats


def test_random_start_as_the_reference_draws_it(toy_data):
    """One coin per attacked batch with probability 0.8; x0 = clamp(x̂ + ε n/‖n‖) on the ε-sphere.

    The step's total change from x̂ capped at ε.
    """
    hook = DATHook(tokenizer=ScalarQuantizer(), alpha=0.5, eps=0.3, random_start=True,
                   random_start_prob=0.8, requantize='input', seed=3)
    coins = [hook.takes_random_start(i) for i in range(2000)]
    assert abs(sum(coins) / len(coins) - 0.8) < 0.03  # 4 standard deviations
    assert coins == [DATHook(tokenizer=ScalarQuantizer(), random_start=True, random_start_prob=0.8,
                             seed=3).takes_random_start(i) for i in range(2000)]
    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool)
    noise = hook.random_start_noise(torch.Size((2, 3, 8, 8)), mask, 0)
    torch.testing.assert_close(noise.flatten(1).norm(dim=1), torch.full((2, ), 0.3))
    model, batch = toy_model(SEG_PLAIN)
    hook.attach(model)
    started = next(i for i, c in enumerate(coins) if c)
    hook.attack_batch(batch, started)
    hook.detach()
    assert hook.last_stats['dat_random_start'] == 1
    assert hook.last_stats['dat_delta'] <= 0.3 + 1e-5


class QuadraticLoss(nn.Module):
    """L(x) = ½‖x − target‖²: its input gradient at x is x − target, in closed form."""

    def __init__(self, target: torch.Tensor) -> None:
        super().__init__()
        self.target = target

    def forward(self, x, data_samples=None, mode='loss'):
        return {'loss': 0.5 * ((x - self.target) ** 2).sum()}

    def parse_losses(self, losses):
        return losses['loss'], {}


def test_random_start_step_is_start_plus_the_gradient_step_at_x0():
    """δ = (x0 − x̂) + α g(x0)/‖g(x0)‖ exactly, with a cap that does not bind (‖δ‖ < ε).

    The gradient is taken at the random start x0, not at x̂, and the start is part of δ.
    """
    levels = 2 ** 20  # NOTE: a near-transparent quantiser: x_adv − x̂ is δ to 1e-6
    alpha, eps, it = 0.2, 0.5, 7
    hook = DATHook(tokenizer=ScalarQuantizer(levels), alpha=alpha, eps=eps, random_start=True,
                   random_start_prob=1.0, seed=5)
    hook.space = PixelSpace(nn.Module(), channel_order='rgb', pixel_max=1.)  # the identity
    torch.manual_seed(0)
    pixels = 0.3 + 0.4 * torch.rand(2, 3, 8, 8)
    x_hat = (pixels * levels).round() / levels
    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool)
    x0 = x_hat + hook.random_start_noise(pixels.shape, mask, it)
    assert 0 < x0.min() and x0.max() < 1  # no clamping: x0 − x̂ is the drawn start
    start = x0 - x_hat

    def unit(v: torch.Tensor) -> torch.Tensor:
        return v / v.flatten(1).norm(dim=1).view(-1, 1, 1, 1)
    # a loss whose gradient at x0 points back towards x̂ and sideways: ‖δ‖ < ε
    g = -unit(start) + 0.8 * unit(torch.randn(pixels.shape))
    hook._model = QuadraticLoss(target=x0 - g)
    expected = start + alpha * unit(g)
    assert (expected.flatten(1).norm(dim=1) < eps - 0.05).all()  # the cap does not bind

    out = hook.attack({'inputs': pixels, 'data_samples': None}, it)
    assert hook.last_stats['dat_random_start'] == 1
    torch.testing.assert_close(out['inputs'] - x_hat, expected, atol=2e-6, rtol=0)
    # what a step from x̂ (no start) or the gradient at x̂ would have given is far from it
    assert (alpha * unit(x_hat - (x0 - g)) - expected).abs().max() > 1e-2
    assert (alpha * unit(g) - expected).abs().max() > 1e-2


def test_pixel_rms_budget_is_the_same_at_every_size():
    """budget='pixel_rms': alpha is the RMS change per valid pixel.

    Whatever the size and the padding; at 224² it is the image budget divided by sqrt(3·224²).
    """
    torch.manual_seed(0)
    rms = DATHook(tokenizer=ScalarQuantizer(), alpha=1e-3, eps=1.0, budget='pixel_rms')
    for h, w, valid_w in ((224, 224, 224), (800, 1333, 1000)):
        mask = torch.zeros(1, 1, h, w, dtype=torch.bool)
        mask[..., :valid_w] = True
        delta = rms.perturbation(torch.randn(1, 3, h, w), mask, None)
        per_pixel = float(delta.pow(2).sum() / (3 * h * valid_w)) ** 0.5
        assert per_pixel == pytest.approx(1e-3, rel=1e-4)
        assert not delta[..., valid_w:].any()
    image = DATHook(tokenizer=ScalarQuantizer(), alpha=0.1, eps=0.1)
    same = DATHook(tokenizer=ScalarQuantizer(), alpha=0.1 / (3 * 224 * 224) ** 0.5,
                   eps=0.1 / (3 * 224 * 224) ** 0.5, budget='pixel_rms')
    grad, mask = torch.randn(2, 3, 224, 224), torch.ones(2, 1, 224, 224, dtype=torch.bool)
    torch.testing.assert_close(image.perturbation(grad, mask, None),
                               same.perturbation(grad, mask, None))
    # the same image budget at 1333x800 is ~4.6x smaller per pixel (the spec's figure)
    assert (1333 * 800 / 224 ** 2) ** 0.5 == pytest.approx(4.6, abs=0.05)


def test_alpha_zero_trains_on_the_round_trip_without_an_attack_pass(toy_data):
    model, batch = toy_model(SEG_PLAIN)
    hook = DATHook(tokenizer=ScalarQuantizer(levels=7), alpha=0, mode='replace')
    hook.attach(model)
    calls = []
    model.register_forward_pre_hook(lambda *args: calls.append(1))
    out = hook.attack_batch(batch, 0)
    hook.detach()
    clean = model.data_preprocessor(batch, True)
    pixels = hook.space.to_pixels(clean['inputs'])
    # Q(Q(x)) = Q(x) for a scalar quantiser; the padding is left as it is
    mask = valid_mask(clean['data_samples'], tuple(pixels.shape), pixels.device)
    levels = torch.where(mask, (pixels * 7).round() / 7, pixels)
    torch.testing.assert_close(hook.space.to_pixels(out['inputs']), levels, atol=1e-5, rtol=0)
    assert not calls and 'dat_loss' not in hook.last_stats  # no gradient pass at all
    assert hook.last_stats['dat_delta'] == 0


class PooledBNNet(nn.Module):
    """conv, BN, a global pool and BN again (a PSP/ASPP image-pool branch); a quadratic loss."""

    def __init__(self, norm: type) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.norm, self.pooled = nn.Conv2d(3, 4, 3), norm(4), norm(4)
        self.w = torch.randn(4)

    def forward(self, x, data_samples=None, mode='loss'):
        y = self.norm(self.conv(x))
        z = self.pooled(y.mean((2, 3), keepdim=True)).flatten(1)
        return {'loss': ((y * self.w.view(1, 4, 1, 1)) ** 2).mean((1, 2, 3)).mean()
                + (z * self.w).sum(1).pow(2).mean()}

    def parse_losses(self, losses):
        return losses['loss'], {}


def _attack_gradients(rank: int, world: int, x: torch.Tensor) -> dict:
    """One rank: the DAT attack pass's input gradient for its share of ``x`` (SyncBN layers).

    And with one image per rank.
    """
    hook = DATHook(tokenizer=ScalarQuantizer())
    model = PooledBNNet(SyncBatchNorm).train()
    hook._model = model
    before = copy.deepcopy(model.state_dict())
    share = x.chunk(world)[rank]
    grad, _ = hook.input_gradient(share, None)
    one, _ = hook.input_gradient(share[:1], None)  # one image per GPU, then a global pool
    unchanged = all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    return dict(grad=grad, one=one, unchanged=unchanged, collectives=model.norm.collectives)


def test_attack_pass_keeps_syncbn_synchronised():
    """With 2 processes the attack pass differentiates what DDP + SyncBN train.

    Each rank's input gradient is that of the summed loss over all ranks with statistics over the
    whole batch (a 1-process run on the whole batch); one image per rank through a global pool and
    BN works, as it does in training; the running statistics are restored.
    """
    torch.manual_seed(1)
    x = torch.rand(4, 3, 8, 8)
    ranks = run_ranks(_attack_gradients, x)

    def reference(images: torch.Tensor, world: int) -> torch.Tensor:
        model = PooledBNNet(nn.BatchNorm2d).train()
        images = images.detach().requires_grad_(True)
        # NOTE: in DDP every rank differentiates its own loss (a mean over its images) and
        # SyncBN's backward sums the parts through the shared statistics: the gradient of the
        # ranks' summed losses, world x the whole batch's mean loss
        return torch.autograd.grad(world * model(images)['loss'], images)[0]
    whole = reference(x, 2)
    for rank, out in enumerate(ranks):
        torch.testing.assert_close(out['grad'], whole.chunk(2)[rank], rtol=1e-4, atol=1e-6)
        assert out['unchanged'] and out['collectives'] == 2
    ones = reference(torch.cat([x[:1], x[2:3]]), 2)
    for rank, out in enumerate(ranks):
        torch.testing.assert_close(out['one'], ones[rank:rank + 1], rtol=1e-4, atol=1e-6)
    # per-rank statistics give another gradient: the comparison above can tell them apart
    local = reference(x[:2], 1)
    assert (local - ranks[0]['grad']).abs().max() > 1e-2 * local.abs().max()


def test_pixel_space_round_trip_and_chain_rule():
    pre = nn.Module()
    pre._enable_normalize = True
    pre.mean = torch.tensor([1., 2., 3.]).view(3, 1, 1)
    pre.std = torch.tensor([4., 5., 6.]).view(3, 1, 1)
    pre._channel_conversion = False  # BGR into the model
    space = PixelSpace(pre)
    x = torch.randn(2, 3, 5, 7, dtype=torch.float64).float()
    torch.testing.assert_close(space.from_pixels(space.to_pixels(x)), x)
    p = torch.rand(2, 3, 5, 7, requires_grad=True)
    w = torch.randn(2, 3, 5, 7)
    x_in = space.from_pixels(p).detach().requires_grad_(True)
    g_x, = torch.autograd.grad((space.to_pixels(x_in) * w).sum(), x_in)
    # d/dp of f(p) = w.p is w; grad_to_pixels must recover it from d/dx
    torch.testing.assert_close(space.grad_to_pixels(g_x), w)
    assert space.to_pixels(x)[:, 0].allclose((x[:, 2] * 6 + 3) / 255)  # RGB out of BGR


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="mode must be one of"):
        DATHook(tokenizer=ScalarQuantizer(), mode='double')
    with pytest.raises(ValueError, match='requantize'):
        DATHook(tokenizer=ScalarQuantizer(), requantize='latent')
    with pytest.raises(ValueError, match='prob'):
        DATHook(tokenizer=ScalarQuantizer(), prob=2)
    with pytest.raises(ValueError, match='random_start_prob'):
        DATHook(tokenizer=ScalarQuantizer(), random_start=True, random_start_prob=1.5)
    with pytest.raises(ValueError, match='alpha and eps must be >= 0'):
        DATHook(tokenizer=ScalarQuantizer(), alpha=-0.1)
    with pytest.raises(ValueError, match="budget must be one of"):
        DATHook(tokenizer=ScalarQuantizer(), budget='pixel')
    with pytest.raises(ValueError, match="norm='linf'"):
        DATHook(tokenizer=ScalarQuantizer(), norm='linf', budget='pixel_rms')
    with pytest.raises(TypeError, match="has no 'encode'"):
        DATHook(tokenizer=nn.Linear(2, 2)).build_tokenizer(torch.device('cpu'))


def test_missing_tokenizer_checkpoint_names_the_fix(in_repo):
    hook_cfg = Config.fromfile(str(REPO / DET_DAT)).custom_hooks[0]
    assert hook_cfg.tokenizer.init_cfg.checkpoint == 'work_dirs/vq-small-f16_toy-coco/tokenizer.pth'
    hook_cfg.tokenizer.init_cfg.checkpoint = 'work_dirs/missing/tokenizer.pth'
    hook = DATHook(**{k: v for k, v in hook_cfg.items() if k != 'type'})
    with pytest.raises(FileNotFoundError, match='work_dirs/missing/tokenizer.pth.*train_vq.py'):
        hook.build_tokenizer(torch.device('cpu'))


# -- end to end ------------------------------------------------------------------------------------

def _short(iters: int, ckpt: int = 0) -> list:
    """A few training iterations, no validation, a random tokenizer of the config's arch."""
    return ['--cfg-options', NO_TOKENIZER_WEIGHTS, f'train_cfg.max_iters={iters}',
            'train_cfg.val_begin=1000', f'default_hooks.checkpoint.interval={ckpt or iters}',
            'default_hooks.logger.interval=1', 'train_dataloader.batch_size=2',
            'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
            'val_dataloader.num_workers=0', 'val_dataloader.persistent_workers=False']


def _dat_log_lines(log: str) -> list:
    return [line for line in log.splitlines()
            if 'dat_loss:' in line and 'dat_codes_changed' in line]


@pytest.mark.slow
def test_detector_trains_with_dat_and_resumes(toy_data, tmp_path):
    work = tmp_path / 'dat'
    proc = run_tool_here('train.py', R18_DAT, '--work-dir', work, *_short(2, ckpt=1))
    assert len(_dat_log_lines(proc.stdout + proc.stderr)) == 2
    proc = run_tool_here('train.py', R18_DAT, '--work-dir', work, '--resume', *_short(3, ckpt=1))
    assert safe_load(str(work / 'iter_3.pth'))['meta']['iter'] == 3
    assert len(_dat_log_lines(proc.stdout + proc.stderr)) == 1
    # the checkpoint holds the detector only (the tokenizer is the hook's, not the model's)
    assert not any('tokenizer' in k for k in safe_load(str(work / 'iter_3.pth'))['state_dict'])


def _small_crops(config: str, size: int) -> list:
    """cfg-options that train on ``size`` x ``size`` crops (the crop step found by type)."""
    pipeline = Config.fromfile(str(REPO / config)).train_dataloader.dataset.pipeline
    at = next(i for i, step in enumerate(pipeline) if step['type'] == 'RandomCrop')
    return [f'train_dataloader.dataset.pipeline.{at}.crop_size=({size},{size})',
            f'model.data_preprocessor.size=({size},{size})']


@pytest.mark.slow
def test_segmentor_trains_with_dat_under_amp(toy_data, tmp_path):
    # NOTE: 64 px crops: on CPUs without native bfloat16 (AVX2) every bf16 convolution is
    # emulated, and the 256 px step took three minutes
    proc = run_tool_here('train.py', SEG_DAT, '--work-dir', tmp_path, '--amp', *_short(2),
                         *_small_crops(SEG_DAT, 64))
    log = proc.stdout + proc.stderr
    assert "type='CPUAmpOptimWrapper'" in log and len(_dat_log_lines(log)) == 2


@pytest.mark.slow
def test_dat_with_two_processes(toy_data, tmp_path):
    proc = run_cmd(['bash', REPO / 'tools/dist_train.sh',
                    'configs/toy/yolov3_mobilenetv2_dat_toy-coco.py', '2', '--work-dir', tmp_path,
                    *_short(2)], env={'PORT': str(free_port())})
    log = proc.stdout + proc.stderr
    assert 'GPU number: 2' in log and len(_dat_log_lines(log)) >= 2
    assert safe_load(str(tmp_path / 'iter_2.pth'))['meta']['iter'] == 2


def test_the_dat_base_config_is_the_reference_code():
    """configs/_base_/dat/dat.py holds the reference implementation's choices.

    The spec's "Reference details". And they build.
    """
    hook = Config.fromfile(str(REPO / 'configs/_base_/dat/dat.py')).dat_hook
    reference = dict(alpha=0.1, eps=0.1, budget='image', norm='l2', random_start=True,
                     random_start_prob=0.8, mode='append', requantize='reconstruction')
    assert {k: hook[k] for k in reference} == reference
    assert hook.get('prob', 1.0) == 1.0  # every batch attacked
    built = DATHook(**{k: v for k, v in hook.items() if k != 'type'})
    starts = sum(built.takes_random_start(i) for i in range(1000)) / 1000
    assert 0.75 < starts < 0.85 and built.is_active(0)
