"""tools/train_vq.py: trains a tokenizer on a dataset config's images, resumes, and its output
loads into VQGAN strictly."""
import json
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from mmrobust.apis.train_vq import DEFAULTS, dataset_image_paths
from mmrobust.models.tokenizers import VQGAN

from conftest import REPO, TOKENIZER_CONFIGS, config_id, run_tool

CONFIG = 'configs/tokenizers/vq-small-f16_toy-coco.py'
SMALL = ['model.arch.ch=32', 'model.arch.n_embed=32', 'train.batch_size=2', 'train.crop_size=32',
         'train.num_workers=0', 'train.eval_images=4', 'train.dead_code_interval=2',
         'train.preview_interval=2', 'train.checkpoint_interval=2']


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

    run_tool('train_vq.py', CONFIG, '--work-dir', work, '--resume', '--cfg-options',
             'train.iters=6', *SMALL)
    assert json.loads((work / 'eval.json').read_text())['iters'] == 6
    state = torch.load(work / 'latest_state.pth', weights_only=True)
    assert state['iter'] == 6
    cfg = Config.fromfile(str(REPO / CONFIG))
    cfg.merge_from_dict({'model.arch.ch': 32, 'model.arch.n_embed': 32})  # as SMALL
    model = VQGAN(cfg.model.arch, checkpoint=str(work / 'tokenizer.pth'))
    assert torch.equal(model.quantize.embedding.weight, state['model']['quantize.embedding.weight'])


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
