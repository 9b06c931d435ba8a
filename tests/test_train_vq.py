"""Tokenizer training with mmengine's Runner (VQTokenizerTrainer).

tools/train_vq.py and tools/train.py, resume, DDP, AMP, and its output loading into VQGAN strictly.
"""
import json
from unittest import mock

import pytest
import torch
from mmengine.config import Config
from mmengine.logging import MessageHub
from mmengine.optim import OptimWrapperDict
from mmengine.registry import init_default_scope

from mmrobust.datasets import ImageCrops, ImageCropsDataset
from mmrobust.engine import VQOptimWrapperConstructor
from mmrobust.models.checkpoint import loadable_state
from mmrobust.models.tokenizers import VQGAN, VQTokenizerTrainer
from mmrobust.models.tokenizers.trainer import ema_update

from helpers import (
    REPO,
    TOKENIZER_CONFIGS,
    assert_user_error,
    config_id,
    free_port,
    run_cmd,
    run_ranks,
    run_tool_here,
    run_tool_in_process,
)
from helpers.cpu_sync_bn import convert_to_cpu_sync_bn

CONFIG = 'configs/tokenizers/vq-small-f16_toy-coco.py'
# a small, fast version of the toy recipe: 32 codes, 32-px crops, 4 held-out images
SMALL = ['model.tokenizer.arch.ch=32', 'model.tokenizer.arch.n_embed=32',
         'model.dead_code_interval=2', 'train_dataloader.batch_size=2',
         'train_dataloader.dataset.crop_size=32', 'train_dataloader.num_workers=0',
         'train_dataloader.persistent_workers=False', 'val_dataloader.dataset.max_images=4',
         'val_dataloader.dataset.crop_size=32', 'train_cfg.val_interval=2',
         'default_hooks.checkpoint.interval=2', 'default_hooks.logger.interval=1',
         # 3 autoencoder iterations: a resume at 2 continues the bank the k-means init reads
         'model.ae_warmup=3']


def _iters(n: int) -> list:
    """--cfg-options for a run of n iterations with the cosine schedule over those n."""
    return [f'train_cfg.max_iters={n}', f'param_scheduler.0.T_max={n}',
            f'param_scheduler.0.end={n}']


def _small_arch() -> dict:
    cfg = Config.fromfile(str(REPO / CONFIG))
    cfg.merge_from_dict({'model.tokenizer.arch.ch': 32, 'model.tokenizer.arch.n_embed': 32})
    return cfg.model.tokenizer.arch


@pytest.mark.slow
def test_train_vq_runs_resumes_like_an_uninterrupted_run_and_loads(toy_data, tmp_path):
    """tools/train_vq.py (the README's command) trains through the Runner.

    2 iterations and then --resume to 4 give the tokenizer of 4 straight, bit for bit (the
    autoencoder warm-up's latent bank across the resume, the k-means init and the dead-code restart
    after it included: they are seeded per iteration). tokenizer.pth and the Runner checkpoints load
    into VQGAN strictly, and into the DAT hook through init_cfg.
    """
    straight, resumed = tmp_path / 'straight', tmp_path / 'resumed'
    proc = run_tool_here('train_vq.py', CONFIG, '--work-dir', straight, '--cfg-options', *SMALL,
                         *_iters(4))
    result = json.loads((straight / 'eval.json').read_text())
    assert result['iters'] == 4
    assert 1 <= result['used_codes'] <= 32 and 1 <= result['perplexity'] <= 32
    assert {'psnr', 'psnr_mean_image', 'psnr_blur', 'seconds'} <= set(result)
    assert (straight / 'previews' / 'iter_000002.png').is_file()
    assert 'window_perplexity' in proc.stdout + proc.stderr and 'vq/psnr' in proc.stdout

    run_tool_here('train.py', CONFIG, '--work-dir', resumed, '--cfg-options', *SMALL, *_iters(4),
                  'train_cfg.max_iters=2')
    proc = run_tool_here('train_vq.py', CONFIG, '--work-dir', resumed, '--resume', '--cfg-options',
                         *SMALL, *_iters(4))
    assert 'resumed' in (proc.stdout + proc.stderr).lower()
    a = torch.load(straight / 'tokenizer.pth', weights_only=True)
    b = torch.load(resumed / 'tokenizer.pth', weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    from mmrobust.utils import safe_load
    ckpt = safe_load(str(resumed / 'iter_4.pth'))
    assert ckpt['meta']['iter'] == 4
    model = VQGAN(_small_arch(), checkpoint=str(resumed / 'tokenizer.pth'))
    from_runner = VQGAN(_small_arch(), checkpoint=str(resumed / 'iter_4.pth'))
    for key, value in model.state_dict().items():
        assert torch.equal(value, from_runner.state_dict()[key])
        assert torch.equal(value, ckpt['state_dict'][f'tokenizer.{key}'])
    # what the DAT hook does with a tokenizer config: init_cfg, strictly, a Runner checkpoint
    from mmrobust.engine import DATHook
    hook = DATHook(tokenizer=dict(type='VQGAN', arch=_small_arch(), init_cfg=dict(
        type='Pretrained', checkpoint=str(resumed / 'iter_4.pth'))))
    tok = hook.build_tokenizer(torch.device('cpu'))
    assert torch.equal(tok.quantize.embedding.weight, model.quantize.embedding.weight)


@pytest.mark.slow
def test_tokenizer_trains_on_two_processes_with_amp_gan_and_ema(toy_data, tmp_path):
    """dist_train.sh (2 processes, gloo) with --amp, the PatchGAN term and the EMA codebook.

    The separately wrapped generator and discriminator, and the EMA statistics summed over ranks.
    """
    work = tmp_path / 'ddp'
    proc = run_cmd(['bash', REPO / 'tools/dist_train.sh', CONFIG, '2', '--amp', '--work-dir', work,
                    '--cfg-options', *SMALL, *_iters(2), 'model.gan_weight=0.1',
                    'model.codebook_ema=0.99', 'model.ae_warmup=1'],
                   env={'PORT': str(free_port())})
    log = proc.stdout + proc.stderr
    assert 'Distributed training: True' in log and 'disc_loss' in log
    assert 'CPUAmpOptimWrapper' in (work / 'vq-small-f16_toy-coco.py').read_text()
    assert json.loads((work / 'eval.json').read_text())['iters'] == 2
    # the parts were wrapped one by one; the checkpoint has the keys of a 1-process run
    from mmrobust.utils import safe_load
    keys = list(safe_load(str(work / 'iter_2.pth'))['state_dict'])
    assert keys and not any('.module.' in k or k.startswith('module.') for k in keys)
    assert any(k.startswith('loss.discriminator.') for k in keys)
    VQGAN(_small_arch(), checkpoint=str(work / 'iter_2.pth'))


def _train_tokenizer(rank: int, world: int, images: torch.Tensor, restarts: bool) -> dict:
    """Train the small tokenizer (EMA codebook) on ``images[it]``, split over the ranks.

    With the wrapper and SyncBN the tokenizer configs use in DDP; its state at the end. With
    ``restarts``: an autoencoder warm-up of one iteration (its k-means init: rank 0's), code
    restarts every iteration and the PatchGAN term. Without, the codebook starts as initialised (no
    restart from one rank's latents), so a run on all images in one process is the same computation.
    """
    from mmengine.model import MMSeparateDistributedDataParallel
    init_default_scope('mmdet')
    model = _trainer(gan_weight=0.1 if restarts else 0., codebook_ema=0.9,
                     dead_code_interval=1 if restarts else 0, ae_warmup=1 if restarts else 0)
    if not restarts:
        model.state.codebook_ready.fill_(True)
    wrapped = model
    if world > 1:  # NOTE: what the Runner does with the config's sync_bn='torch' (on the CPU)
        wrapped = MMSeparateDistributedDataParallel(convert_to_cpu_sync_bn(model))
    # NOTE: built after the wrapping, as the Runner does (SyncBN has new parameters); SGD, not
    # Adam: Adam's first steps are about lr * sign(g), so float-rounding differences of a
    # gradient near 0 would flip whole steps, and this compares the algorithm
    sgd = dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1))
    wrappers = VQOptimWrapperConstructor(dict(generator=sgd, discriminator=sgd))(model)
    for it, batch in enumerate(images):
        MessageHub.get_current_instance().update_info('iter', it)
        wrapped.train_step({'inputs': batch.chunk(world)[rank]}, wrappers)
    return {k: v.detach().clone() for k, v in loadable_state(model).items()}


def _train_tokenizers(rank: int, world: int, images: torch.Tensor) -> tuple:
    """One rank: the tokenizer trained without and with code restarts."""
    return tuple(_train_tokenizer(rank, world, images, restarts) for restarts in (False, True))


@pytest.mark.slow
def test_two_ranks_train_one_tokenizer_and_the_one_of_a_single_process():
    """2 processes (gloo; the config's MMSeparateDistributedDataParallel and SyncBN).

    The ranks end with the same codebook, tokenizer (BN statistics included) and discriminator, bit
    for bit, with code restarts (rank 0's draw) and the PatchGAN term and without. Without, the
    tokenizer is the one a single process trains on both ranks' images together (DDP averages the
    gradients, the EMA codebook sums the statistics, SyncBN normalises over both): every tensor's
    change from its initial value agrees to 0.1%.
    """
    torch.manual_seed(3)
    images = torch.rand(2, 4, 3, 32, 32)  # 2 iterations of 2 images per rank
    (ranks, restarted) = zip(*run_ranks(_train_tokenizers, images))
    single = _train_tokenizer(0, 1, images, False)
    initial = _train_tokenizer(0, 1, images[:0], False)
    for a, b in (ranks, restarted):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a
                                                         if not torch.equal(a[k], b[k])]
    codebook = 'tokenizer.quantize.embedding.weight'
    assert not torch.equal(ranks[0][codebook], restarted[0][codebook])
    assert ranks[0].keys() == single.keys()
    moved, floats = 0, 0
    for key, value in single.items():
        if not value.is_floating_point():
            assert torch.equal(ranks[0][key], value), key  # usage counts, step counters
            continue
        change = (value - initial[key]).norm()
        moved, floats = moved + bool(change > 0), floats + 1
        assert (ranks[0][key] - value).norm() <= 1e-3 * change + 1e-6, key
    # the comparison is of trained values, the codebook's among them
    assert moved > 0.9 * floats and not torch.equal(single[codebook], initial[codebook])


def _trainer(**kwargs) -> VQTokenizerTrainer:
    init_default_scope('mmdet')  # NOTE: not whatever scope an earlier test left current
    torch.manual_seed(0)
    return VQTokenizerTrainer(dict(type='VQGAN', arch=_small_arch()), **kwargs)


def _step(model, wrappers, it: int, images: torch.Tensor) -> dict:
    MessageHub.get_current_instance().update_info('iter', it)
    return model.train_step({'inputs': images}, wrappers)


def test_generator_and_discriminator_optimizers_and_ema_codebook():
    init_default_scope('mmdet')
    model = _trainer(gan_weight=0.1, codebook_ema=0.9, dead_code_interval=0)
    adam = dict(type='OptimWrapper', optimizer=dict(type='Adam', lr=1e-3))
    wrappers = VQOptimWrapperConstructor(dict(generator=adam, discriminator=adam))(model)
    assert isinstance(wrappers, OptimWrapperDict)
    assert set(wrappers.keys()) == {'generator', 'discriminator'}
    codebook = model.codebook
    generator = {id(p) for g in wrappers['generator'].param_groups for p in g['params']}
    assert id(codebook) not in generator and not codebook.requires_grad  # moved by its EMA
    assert len(generator) == sum(1 for p in model.vqgan.parameters()) - 1
    images = torch.rand(2, 3, 32, 32)
    _step(model, wrappers, 0, images)
    before_codes = codebook.detach().clone()
    before_disc = [p.detach().clone() for p in model.state.discriminator.parameters()]
    log = _step(model, wrappers, 1, images)
    assert {'loss', 'vq_loss', 'gan_loss', 'disc_loss'} <= set(log)
    assert not torch.equal(codebook, before_codes)  # the EMA moved the used codes
    assert any(not torch.equal(a, b) for a, b in
               zip(before_disc, model.state.discriminator.parameters()))
    assert model.state.codebook_ready


def test_ema_update_is_the_running_mean_of_assigned_latents():
    torch.manual_seed(0)
    codebook = torch.randn(4, 3)
    size, embed_sum = torch.ones(4), codebook.clone()
    flat = torch.randn(8, 3)
    idx = torch.tensor([0, 0, 1, 2, 2, 2, 1, 0])
    counts = torch.bincount(idx, minlength=4).float()
    sums = torch.zeros(4, 3).index_add_(0, idx, flat)
    before = codebook.clone()
    ema_update(codebook, size, embed_sum, counts, sums, decay=0.9)
    expected_size = 0.9 + 0.1 * counts
    total = expected_size.sum()
    expected_size = (expected_size + 1e-5) / (total + 4 * 1e-5) * total
    torch.testing.assert_close(codebook, (0.9 * before + 0.1 * sums) / expected_size[:, None])


def test_restarts_are_seeded_per_iteration():
    model = _trainer(dead_code_interval=1)
    images = torch.rand(2, 3, 32, 32)
    model.restart_codes(torch.arange(4), images, it=7)
    first = model.codebook[:4].detach().clone()
    model.restart_codes(torch.arange(4), images, it=7)
    assert torch.equal(first, model.codebook[:4])


def test_autoencoder_warmup_then_kmeans_codebook():
    """The autoencoder warm-up banks latents, then k-means seeds the codebook.

    During ``ae_warmup`` the decoder reads the latents themselves (no VQ loss, the codebook
    untouched) and the latest latents are banked (in the checkpointed state, so a resume continues
    the same bank); then the codebook becomes k-means centroids of the bank.
    """
    model = _trainer(ae_warmup=2, dead_code_interval=1)
    adam = dict(type='OptimWrapper', optimizer=dict(type='Adam', lr=1e-3))
    wrappers = VQOptimWrapperConstructor(dict(generator=adam))(model)
    images = torch.rand(2, 3, 32, 32)
    before = model.codebook.detach().clone()
    for it in range(2):
        log = _step(model, wrappers, it, images)
        assert float(log['vq_loss']) == 0 and 'dead_codes_reset' not in log
    assert torch.equal(model.codebook, before) and not model.state.codebook_ready
    assert int(model.state.bank_filled) == 2 * 2 * 2 * 2  # 2 steps x 2 images x 2x2 latents
    assert 'loss.bank' in model.state_dict() and 'loss.bank_filled' in model.state_dict()
    _step(model, wrappers, 2, images)
    assert model.state.codebook_ready and not torch.equal(model.codebook, before)
    assert int(model.state.bank_filled) == 0  # served: emptied
    log = _step(model, wrappers, 3, torch.rand(2, 3, 32, 32))
    assert float(log['vq_loss']) > 0 and 'dead_codes_reset' in log  # quantised from now on


def test_kmeans_init_finds_the_clusters_of_the_latents():
    model = _trainer(ae_warmup=1)  # 32 codes of 256 dims
    gen = torch.Generator().manual_seed(0)
    centres = 10 * torch.randn(32, 256, generator=gen)
    points = centres.repeat(4, 1) + 0.01 * torch.randn(128, 256, generator=gen)
    codebooks = []
    for _ in range(2):
        model.state.bank.copy_(points)
        model.state.bank_filled.fill_(len(points))
        with torch.no_grad(), mock_encode(model, centres[:1]):
            model.kmeans_init(torch.rand(1, 3, 16, 16), it=5)
        codebooks.append(model.codebook.detach().clone())
        assert int(model.state.bank_filled) == 0
    # every cluster gets a code at its mean (up to the noise), whatever the random start
    dist = torch.cdist(centres, codebooks[0])
    assert dist.min(1).values.max() < 0.5  # clusters lie ~200 apart, the noise ~0.16
    assert torch.equal(*codebooks)  # seeded by (seed, iteration)


def mock_encode(model, latents):
    """The encoder's latents of any image batch: ``latents`` (N, D) as one 1 x N grid."""
    grid = latents.t().reshape(1, latents.shape[1], 1, len(latents))
    return mock.patch.object(model.vqgan, 'encode_latent', lambda images: grid)


def test_zero_init_output_starts_grey_and_yields_to_a_loaded_tokenizer(tmp_path):
    """zero_init_output: a tokenizer trained from scratch reconstructs flat grey at first.

    And its first step moves the last convolution; a tokenizer given a checkpoint keeps it, and the
    log says so; an init_cfg checkpoint (loaded by init_weights) replaces the zeros.
    """
    model = _trainer(zero_init_output=True, ae_warmup=2)
    conv = model.vqgan.decoder.conv_out
    assert not conv.weight.any() and not conv.bias.any()
    images = torch.rand(2, 3, 32, 32)
    recon, _, _ = model.tokenizer(images, quantize=False)
    assert torch.equal(recon, torch.full_like(recon, 0.5))
    adam = dict(type='OptimWrapper', optimizer=dict(type='Adam', lr=1e-3))
    _step(model, VQOptimWrapperConstructor(dict(generator=adam))(model), 0, images)
    assert conv.weight.any()
    default = _trainer().vqgan.decoder.conv_out.weight
    assert default.abs().min() > 0  # off by default: the usual initialisation
    path = tmp_path / 'tok.pth'
    torch.save(_trainer().vqgan.state_dict(), path)
    with mock.patch('mmrobust.models.tokenizers.trainer.print_log') as log:
        loaded = VQTokenizerTrainer(dict(type='VQGAN', arch=_small_arch(),
                                         checkpoint=str(path)), zero_init_output=True)
    assert torch.equal(loaded.vqgan.decoder.conv_out.weight, default)
    assert 'decoder keeps the loaded weights' in log.call_args.args[0]
    later = VQTokenizerTrainer(dict(type='VQGAN', arch=_small_arch(), init_cfg=dict(
        type='Pretrained', checkpoint=str(path))), zero_init_output=True)
    later.init_weights()
    assert torch.equal(later.vqgan.decoder.conv_out.weight, default)


def test_trainer_refuses_bad_warmup_settings():
    with pytest.raises(ValueError, match='ae_warmup must be >= 0 and kmeans_iters >= 1'):
        _trainer(ae_warmup=-1)


@pytest.mark.parametrize('path', TOKENIZER_CONFIGS, ids=config_id)
def test_tokenizer_config_builds(path, toy_data, in_repo):
    from mmengine.registry import DATASETS, MODELS
    cfg = Config.fromfile(path)
    assert cfg.custom_imports.imports == ['mmrobust']
    init_default_scope(cfg.default_scope)
    model = MODELS.build(cfg.model)
    assert isinstance(model, VQTokenizerTrainer)
    for loader in ('train_dataloader', 'val_dataloader'):
        dataset = DATASETS.build(cfg[loader].dataset)
        assert isinstance(dataset, ImageCropsDataset) and len(dataset)
        assert dataset[0]['inputs'].shape[-1] % model.vqgan.factor == 0


def test_former_train_vq_configs_and_states_say_what_to_do(tmp_path, in_repo):
    from mmrobust.apis import apply_train_args, build_runner
    old = Config(dict(model=dict(type='VQGAN'), data=dict(config='x.py'), train=dict(iters=10)))
    with pytest.raises(RuntimeError, match='train.iters -> train_cfg.max_iters'):
        build_runner(old, ('train_dataloader', ))
    cfg = Config.fromfile(CONFIG)
    cfg.work_dir = str(tmp_path)
    (tmp_path / 'latest_state.pth').write_bytes(b'')
    with pytest.raises(RuntimeError, match='former train_vq loop'):
        apply_train_args(cfg, 'auto', False, False)


def test_image_crops_keep_the_image_scale(tmp_path):
    import cv2
    import numpy as np
    rng = np.random.default_rng(0)
    big = rng.integers(0, 256, (100, 200, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / 'big.png'), big)
    cv2.imwrite(str(tmp_path / 'small.png'), big[:20, :20])
    paths = [str(tmp_path / 'big.png'), str(tmp_path / 'small.png')]
    crops = ImageCrops(paths, 32, train=False, scale_range=(0.25, 0.75))  # evaluated at 0.5
    half = cv2.cvtColor(cv2.resize(big, (100, 50), interpolation=cv2.INTER_AREA),
                        cv2.COLOR_BGR2RGB)
    expected = torch.from_numpy(half[9:41, 34:66].copy()).permute(2, 0, 1).float() / 255
    assert torch.equal(crops[0], expected)
    assert crops[1].shape == (3, 32, 32)  # smaller than the crop: enlarged to fit
    train = ImageCrops(paths, 32, train=True, scale_range=(0.3, 1.0))
    assert all(train[i % 2].shape == (3, 32, 32) for i in range(6))
    assert 0 <= train[0].min() and train[0].max() <= 1
    with pytest.raises(ValueError, match='scale_range'):
        ImageCrops(paths, 32, train=True, scale_range=(1.0, 0.5))


def test_seed_table_reuses_finished_seeds_and_reports_the_spread(tmp_path):
    """tools/analysis_tools/tokenizer_seeds.py.

    A seed whose eval.json exists is not trained again (a killed run resumes at the next seed); the
    table has every seed with the PSNR at each validation of its run, the spread and the CPU.
    """
    for seed, psnr in ((0, 19.25), (1, 18.5)):
        (tmp_path / f'seed_{seed}').mkdir()
        (tmp_path / f'seed_{seed}' / 'eval.json').write_text(json.dumps(dict(
            iters=1500, seconds=300.0, psnr=psnr, psnr_mean_image=15.62, psnr_blur=22.71,
            perplexity=150.2, used_codes=220)))
    # the run's scalars: training rows, then a validation row per val_interval
    vis = tmp_path / 'seed_0' / '20261205_120000' / 'vis_data'
    vis.mkdir(parents=True)
    vis.joinpath('scalars.json').write_text('\n'.join(json.dumps(row) for row in (
        {'loss': 0.1, 'step': 50}, {'vq/psnr': 14.21, 'step': 300}, {'loss': 0.05, 'step': 350},
        {'vq/psnr': 17.93, 'step': 600}, {'vq/psnr': 19.25, 'step': 1500})) + '\n')
    status, out, _ = run_tool_in_process('analysis_tools/tokenizer_seeds.py', '--seeds', '0',
                                         '1', '--work-dir', tmp_path)
    assert status == 0 and 'seed 0:' not in out  # nothing trained
    assert '| 0 | 19.25 dB | 220 | 150 | 15.62 dB | 22.71 dB | 300 | 14.2, 17.9, 19.2 |' in out
    assert '| 1 | 18.50 dB |' in out and '| 300 | - |' in out  # no run log: no trajectory
    assert 'PSNR: min 18.50 dB, max 19.25 dB, spread 0.75 dB over 2 seeds' in out
    assert 'CPU: ' in out and 'cores' in out


@pytest.mark.parametrize('recipe, psnr, passes', [
    ('current (seeds 0-2, README figures)', (18.78, 18.83, 22.03), True),
    ('former: Adam 1e-3, no warm-up (seeds 0-1)', (16.07, 17.31), False),
])
def test_the_recipe_check_fails_a_recipe_that_learns_too_little(recipe, psnr, passes, tmp_path):
    """tokenizer_seeds.py --min-margin 2.

    A seed less than 2 dB above the mean-colour baseline (15.62 dB on the held-out crops) fails the
    check, with the seed and its margin. The recorded held-out PSNR of the former recipe fails it,
    the current recipe's passes.
    """
    for seed, value in enumerate(psnr):
        (tmp_path / f'seed_{seed}').mkdir()
        (tmp_path / f'seed_{seed}' / 'eval.json').write_text(json.dumps(dict(
            iters=1500, seconds=520.0, psnr=value, psnr_mean_image=15.62, psnr_blur=22.71,
            perplexity=150.0, used_codes=200)))
    status, out, err = run_tool_in_process(
        'analysis_tools/tokenizer_seeds.py', '--seeds', *range(len(psnr)), '--work-dir',
        tmp_path, '--min-margin', '2')
    if passes:
        assert status == 0
        assert 'every seed at least 2.00 dB above the mean-colour baseline' in out
    else:
        assert_user_error(status, err, 1, 'seed(s) 0 (+0.45 dB)',
                          '--min-margin asks for +2.00 dB')
        assert '1 (+1.69 dB)' in err  # every seed short of the margin is listed


def test_validation_during_the_warm_up_measures_the_autoencoder():
    """Before the codebook exists (ae_warmup), validation reconstructs with the quantiser bypassed.

    As the warm-up trains; once it exists, through the codes.
    """
    model = _trainer(ae_warmup=2).eval()
    images = torch.rand(2, 3, 32, 32)
    vq = model.vqgan
    # codes far from any latent: the two paths must give different reconstructions
    model.codebook.data.normal_(0, 50, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model.val_step({'inputs': images})
        autoencoder = vq.decode_latent(vq.encode_latent(images))
        assert before[0]['sq_err_recon'] == pytest.approx(
            float((autoencoder[0] - images[0]).pow(2).sum()), rel=1e-5)
        model.state.codebook_ready.fill_(True)
        after = model.val_step({'inputs': images})
        quantised = vq.decode(vq.encode(images)).clamp(0, 1)
        assert after[0]['sq_err_recon'] == pytest.approx(
            float((quantised[0] - images[0]).pow(2).sum()), rel=1e-5)
    assert before[0]['sq_err_recon'] != pytest.approx(after[0]['sq_err_recon'], rel=1e-3)
    # without a warm-up nothing changes: the codes from the first validation on
    plain = _trainer().eval()
    with torch.no_grad():
        out = plain.val_step({'inputs': images})
        expected = plain.vqgan.decode(plain.vqgan.encode(images)).clamp(0, 1)
    assert out[0]['sq_err_recon'] == pytest.approx(
        float((expected[0] - images[0]).pow(2).sum()), rel=1e-5)
