"""tools/train_vq.py: trains a tokenizer on a dataset config's images, resumes, and its output
loads into VQGAN strictly."""
import json
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from mmrobust.apis.train_vq import DEFAULTS, CodebookEMA
from mmrobust.datasets import ImageCrops, dataset_image_paths
from mmrobust.models.tokenizers import VQGAN

from conftest import REPO, TOKENIZER_CONFIGS, config_id, run_tool

CONFIG = 'configs/tokenizers/vq-small-f16_toy-coco.py'
SMALL = ['model.arch.ch=32', 'model.arch.n_embed=32', 'train.batch_size=2', 'train.crop_size=32',
         'train.num_workers=0', 'train.eval_images=4', 'train.dead_code_interval=2',
         'train.preview_interval=2', 'train.checkpoint_interval=2']


@pytest.mark.slow
def test_train_vq_runs_resumes_and_loads(toy_data, tmp_path):
    work = tmp_path / 'vq'
    run_tool('train_vq.py', CONFIG, '--work-dir', work, '--cfg-options', 'train.iters=4', *SMALL)
    result = json.loads((work / 'eval.json').read_text())
    assert result['iters'] == 4
    assert 1 <= result['used_codes'] <= 32 and 1 <= result['perplexity'] <= 32
    assert {'psnr', 'psnr_mean_image', 'psnr_blur'} <= set(result)
    assert (work / 'previews' / 'iter_000002.png').is_file()
    assert (work / 'previews' / 'final.png').is_file()
    log = [json.loads(line) for line in (work / 'log.jsonl').read_text().splitlines()]
    assert [r['iter'] for r in log] == [2, 4] and 'window_perplexity' in log[0]
    assert {'eval_psnr', 'eval_used_codes', 'eval_perplexity'} <= set(log[0])

    run_tool('train_vq.py', CONFIG, '--work-dir', work, '--resume', '--cfg-options',
             'train.iters=6', *SMALL)
    assert json.loads((work / 'eval.json').read_text())['iters'] == 6
    state = torch.load(work / 'latest_state.pth', weights_only=True)
    assert state['iter'] == 6
    cfg = Config.fromfile(str(REPO / CONFIG))
    cfg.merge_from_dict({'model.arch.ch': 32, 'model.arch.n_embed': 32})  # as SMALL
    model = VQGAN(cfg.model.arch, checkpoint=str(work / 'tokenizer.pth'))
    assert torch.equal(model.quantize.embedding.weight, state['model']['quantize.embedding.weight'])
    # a run without an EMA codebook cannot be resumed with one
    proc = run_tool('train_vq.py', CONFIG, '--work-dir', work, '--resume', '--cfg-options',
                    'train.iters=8', *SMALL, 'train.codebook_ema=0.99', check=False)
    assert proc.returncode != 0 and 'trained without codebook_ema' in proc.stderr


@pytest.mark.parametrize('path', TOKENIZER_CONFIGS, ids=config_id)
def test_tokenizer_config_builds(path, toy_data, in_repo):
    cfg = Config.fromfile(path)
    assert cfg.custom_imports.imports == ['mmrobust']
    assert set(cfg.train) <= set(DEFAULTS)
    model = VQGAN(**{k: v for k, v in cfg.model.items() if k != 'type'})
    assert cfg.train.crop_size % model.factor == 0
    for loader in (cfg.data.train, cfg.data.val):
        paths = dataset_image_paths(cfg.data.config, loader)
        assert paths and all(osp.isfile(p) for p in paths[:3])
    assert osp.isfile(REPO / cfg.data.config)


def test_codebook_ema_is_the_running_mean_of_assigned_latents():
    torch.manual_seed(0)
    codebook = torch.randn(4, 3)
    ema = CodebookEMA(codebook, decay=0.9)
    z = torch.randn(2, 3, 2, 2)
    codes = torch.tensor([[[0, 0], [1, 2]], [[2, 2], [1, 0]]])
    before = codebook.clone()
    ema.update(z, codes)
    flat, idx = z.permute(0, 2, 3, 1).reshape(-1, 3), codes.flatten()
    counts = torch.bincount(idx, minlength=4).float()
    size = 0.9 + 0.1 * counts
    total = size.sum()
    size = (size + ema.eps) / (total + 4 * ema.eps) * total
    sums = 0.9 * before + 0.1 * torch.stack([flat[idx == k].sum(0) for k in range(4)])
    torch.testing.assert_close(codebook, sums / size[:, None])
    # a code fed the same latent converges to it; an unused one stays where it was
    target = torch.tensor([1.0, -2.0, 0.5])
    for _ in range(300):
        ema.update(target.view(1, 3, 1, 1), torch.zeros(1, 1, 1, dtype=torch.long))
    torch.testing.assert_close(codebook[0], target, atol=1e-3, rtol=0)
    ema.reset(torch.tensor([3]), torch.ones(1, 3))
    assert torch.equal(codebook[3], torch.ones(3)) and ema.cluster_size[3] == 1
    with pytest.raises(ValueError, match='codebook_ema'):
        CodebookEMA(codebook, decay=1.0)


@pytest.mark.slow
def test_train_vq_with_batchnorm_and_ema_codebook_resumes(toy_data, tmp_path):
    work = tmp_path / 'vq'
    opts = [*SMALL, 'model.arch.norm=batch', 'train.codebook_ema=0.99']
    run_tool('train_vq.py', CONFIG, '--work-dir', work, '--cfg-options', 'train.iters=2', *opts)
    first = torch.load(work / 'latest_state.pth', weights_only=True)
    assert set(first['codebook_ema']) == {'cluster_size', 'embed_sum'}
    run_tool('train_vq.py', CONFIG, '--work-dir', work, '--resume', '--cfg-options',
             'train.iters=4', *opts)
    state = torch.load(work / 'latest_state.pth', weights_only=True)
    assert state['iter'] == 4
    assert not torch.equal(state['codebook_ema']['embed_sum'], first['codebook_ema']['embed_sum'])
    # the EMA codebook is not an optimiser parameter: Adam holds states for the others only
    buffers = sum(k.endswith(('running_mean', 'running_var', 'num_batches_tracked'))
                  for k in state['model'])
    assert len(state['optimizer']['state']) == len(state['model']) - buffers - 1


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


@pytest.mark.parametrize('key,value', [('recon_loss', 'l3'), ('lr_schedule', 'step'),
                                       ('crop_size', 40), ('warmup', 10)])
def test_bad_train_options_fail_before_any_work(key, value, toy_data, tmp_path, in_repo):
    from mmrobust.apis.train_vq import train_vq
    cfg = Config.fromfile(CONFIG)
    cfg.train[key] = value
    with pytest.raises((KeyError, ValueError), match=key):
        train_vq(cfg, str(tmp_path / 'work'))
    assert not (tmp_path / 'work' / 'tokenizer.pth').exists()
