"""What the tokenizer keeps: quantize_images at any size, the token-view analysis and its tool."""
import json

import cv2
import numpy as np
import pytest
import torch

from mmrobust.analysis import load_tokenizer, read_rgb, token_view
from mmrobust.models.tokenizers import VQGAN, quantize_images

from helpers import REPO, run_tool

ARCH = dict(ch=32, ch_mult=(1, 2, 2, 2, 2), num_res_blocks=1, attn_resolutions=(),
            resolution=256, z_channels=256, embed_dim=256, n_embed=64)


@pytest.fixture(scope='module')
def tokenizer():
    torch.manual_seed(0)
    return VQGAN(arch=ARCH).eval()


def test_quantize_images_any_size(tokenizer):
    x = torch.rand(2, 3, 37, 53)
    recon, codes = quantize_images(tokenizer, x)
    assert recon.shape == x.shape and codes.shape == (2, 3, 4)  # ceil(37/16), ceil(53/16)
    assert 0 <= recon.min() and recon.max() <= 1
    # padding replicates the border: the same as quantising the padded image and cropping
    padded = torch.nn.functional.pad(x, (0, 11, 0, 11), mode='replicate')
    torch.testing.assert_close(tokenizer.reconstruct(padded)[..., :37, :53], recon)


def test_token_view_writes_grids_and_numbers(tokenizer, tmp_path):
    rng = np.random.default_rng(0)
    images = {f'img{i}.jpg': rng.integers(0, 256, (40 + 8 * i, 56, 3), dtype=np.uint8)
              for i in range(2)}
    result = token_view(tokenizer, images, str(tmp_path), ['gaussian_noise', 'fog'], [1, 5],
                        show_severity=5, progress=False)
    for i, img in enumerate(images.values()):
        grid = cv2.imread(str(tmp_path / f'img{i}.png'))
        assert grid.shape == (2 * img.shape[0], 3 * img.shape[1], 3)  # clean + 2 corruptions
    saved = json.loads((tmp_path / 'token_view.json').read_text())
    assert saved == result and saved['images'] == 2
    assert set(saved['codes_changed']) == {'gaussian_noise', 'fog'}
    values = [v for per in saved['codes_changed'].values() for v in per.values()]
    assert all(0 <= v <= 1 for v in values)
    assert saved['codes_changed']['gaussian_noise']['5'] > 0  # heavy noise flips codes
    # re-encoding the (8-bit) reconstruction, by hand: Q(Q(x)) against Q(x)
    drift = []
    for img in images.values():
        x = torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255
        recon, codes = quantize_images(tokenizer, x)
        recon = (recon.clamp(0, 1) * 255).round() / 255
        drift.append(float((quantize_images(tokenizer, recon)[1] != codes).float().mean()))
    assert saved['codes_changed_reencoding'] == pytest.approx(np.mean(drift))
    with pytest.raises(KeyError, match='unknown corruptions'):
        token_view(tokenizer, images, str(tmp_path), ['rain'], progress=False)


def test_load_tokenizer_needs_weights_and_a_tokenizer(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match='--checkpoint'):
        load_tokenizer('small_f16')
    with pytest.raises(FileNotFoundError, match='neither a VQGAN arch'):
        load_tokenizer('f32_nothing')
    with pytest.raises(ValueError, match='no VQGAN `model`'):
        load_tokenizer(str(REPO / 'configs/toy/mask-rcnn_r18_fpn_toy-coco.py'))
    # a tokenizer config without init_cfg: train_vq's default output, when it exists
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'tok.py').write_text(f'model = dict(type="VQGAN", arch={ARCH!r})\n')
    with pytest.raises(ValueError, match='work_dirs/<config>/tokenizer.pth'):
        load_tokenizer('tok.py')
    trained = VQGAN(ARCH)
    (tmp_path / 'work_dirs' / 'tok').mkdir(parents=True)
    torch.save(trained.state_dict(), tmp_path / 'work_dirs' / 'tok' / 'tokenizer.pth')
    loaded = load_tokenizer('tok.py')
    assert torch.equal(loaded.quantize.embedding.weight, trained.quantize.embedding.weight)
    # a tokenizer-training config (VQTokenizerTrainer) names its VQGAN as `tokenizer`
    (tmp_path / 'tok.py').write_text(
        f'model = dict(type="VQTokenizerTrainer", tokenizer=dict(type="VQGAN", arch={ARCH!r}))\n')
    loaded = load_tokenizer('tok.py')
    assert torch.equal(loaded.quantize.embedding.weight, trained.quantize.embedding.weight)
    bad = tmp_path / 'broken.jpg'
    bad.write_bytes(b'\xff\xd8 not really')
    with pytest.raises(ValueError, match='cannot read image'):
        read_rgb(str(bad))


@pytest.mark.slow
def test_token_view_tool(tokenizer, toy_data, tmp_path):
    ckpt = tmp_path / 'tokenizer.pth'
    torch.save(tokenizer.state_dict(), ckpt)
    cfg = tmp_path / 'tok.py'
    cfg.write_text(f'model = dict(type="VQGAN", arch={ARCH!r})\n')
    images = sorted((toy_data['toy_coco'] / 'val2017').glob('*.jpg'))[:2]
    proc = run_tool('analysis_tools/token_view.py', cfg, '--checkpoint', ckpt, '--images',
                    *images, '--corruptions', 'contrast', '--severities', '3',
                    '--out-dir', tmp_path / 'out')
    assert 'contrast' in proc.stdout and 'codes changed' in proc.stdout
    assert (tmp_path / 'out' / 'codes_changed.png').is_file()
    assert len(list((tmp_path / 'out').glob('0*.png'))) == 2
