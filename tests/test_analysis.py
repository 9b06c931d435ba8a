"""Fourier sensitivity and patch masking (mmrobust.analysis.perturbation) and their tool."""
import json

import numpy as np
import pytest
import torch

from mmrobust.analysis import (
    fourier_basis,
    fourier_perturb,
    frequency_grid,
    mirror_heatmap,
    patch_mask,
)

from helpers import DEMO_DET_CFG, run_tool_here


@pytest.mark.parametrize('h,w,u,v', [(32, 32, 0, 0), (32, 32, 3, -5), (31, 45, 7, 2),
                                     (16, 16, 8, 0)])
def test_fourier_basis_is_a_real_unit_image_of_one_frequency(h, w, u, v):
    basis = fourier_basis(h, w, u, v)
    assert basis.dtype == torch.float32 and basis.shape == (h, w)
    assert basis.norm().item() == pytest.approx(1.0, abs=1e-5)
    spectrum = torch.fft.fft2(basis.double()).abs()
    peaks = {(u % h, v % w), (-u % h, -v % w)}
    for (i, j) in peaks:
        assert spectrum[i, j] > 1e-3
    others = spectrum.clone()
    for (i, j) in peaks:
        others[i, j] = 0
    assert others.max() < 1e-5 * spectrum.max()  # float32 rounding only
    torch.testing.assert_close(fourier_basis(h, w, -u, -v), basis)  # (u, v) ~ (-u, -v)


def test_frequency_grid_covers_the_heatmap_once_with_its_mirror():
    half = frequency_grid(5)
    assert len(half) == 13  # (25 + 1) / 2
    full = {f for u, v in half for f in ((u, v), (-u, -v))}
    assert full == {(u, v) for u in range(-2, 3) for v in range(-2, 3)}
    with pytest.raises(ValueError, match='odd'):
        frequency_grid(4)
    heat = mirror_heatmap({f: float(i) for i, f in enumerate(half)}, 5)
    assert not np.isnan(heat).any()
    np.testing.assert_array_equal(heat, heat[::-1, ::-1])  # point-symmetric


def _two_images():
    pixels = torch.full((2, 3, 40, 48), 0.5)
    mask = torch.zeros(2, 1, 40, 48, dtype=torch.bool)
    mask[0, :, :40, :48] = True
    mask[1, :, :24, :33] = True  # a smaller image, padded
    return pixels, mask


def test_fourier_perturbation_has_the_requested_norm_on_the_image_area():
    pixels, mask = _two_images()
    out = fourier_perturb(pixels, mask, 2, 3, 1.5, torch.Generator().manual_seed(0))
    delta = out - pixels
    assert (delta[1, :, 24:] == 0).all() and (delta[1, :, :, 33:] == 0).all()
    norms = delta.flatten(2).norm(dim=2)
    torch.testing.assert_close(norms, torch.full_like(norms, 1.5), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('ratio', [0.0, 0.25, 0.5, 1.0])
def test_patch_masking_masks_exactly_the_requested_fraction(ratio):
    pixels, mask = _two_images()
    pixels = pixels + torch.rand_like(pixels) * 0.1  # nothing equals the fill by chance
    fill = torch.tensor([0.1, 0.2, 0.3])
    out, counts = patch_mask(pixels, mask, 8, ratio, torch.Generator().manual_seed(1), fill)
    grids = [5 * 6, 3 * 5]  # ceil(40/8) x ceil(48/8), ceil(24/8) x ceil(33/8)
    assert counts == [int(round(ratio * n)) for n in grids]
    filled = (out == fill.view(1, 3, 1, 1)).all(1)
    assert filled[1, 24:].sum() == 0 and filled[1, :, 33:].sum() == 0  # padding untouched
    with pytest.raises(ValueError, match=r'\[0, 1\]'):
        patch_mask(pixels, mask, 8, 1.5, torch.Generator(), fill)


@pytest.mark.slow
def test_fourier_and_masking_tools_on_the_toy_detector(trained_toy_detector, tmp_path):
    ckpt = trained_toy_detector / 'iter_300.pth'
    common = [DEMO_DET_CFG, ckpt, '--num-images', '2',
              '--cfg-options', 'test_dataloader.num_workers=0',
              'test_dataloader.persistent_workers=False']
    out = tmp_path / 'fourier'
    run_tool_here('analysis_tools/perturbation_analysis.py', 'fourier', *common, '--grid', '3',
                  '--eps', '20', '--out-dir', out)
    data = json.loads((out / 'fourier.json').read_text())
    assert set(data['settings']) == {'clean'} | {f'fourier:{u},{v}' for u, v in frequency_grid(3)}
    assert (out / 'fourier.png').is_file()
    matrix = np.load(out / 'fourier_heatmap.npy')
    clean = data['settings']['clean']['coco/bbox_mAP']
    assert matrix.shape == (3, 3) and not np.isnan(matrix).any()
    np.testing.assert_allclose(matrix, matrix[::-1, ::-1])  # (u, v) ~ (-u, -v)
    drop = clean - data['settings']['fourier:1,0']['coco/bbox_mAP']
    np.testing.assert_allclose(matrix[2, 1], drop)
    # a rerun resumes: nothing is evaluated again
    tool = 'analysis_tools/perturbation_analysis.py'
    proc = run_tool_here(tool, 'fourier', *common, '--grid', '3', '--eps', '20', '--out-dir', out)
    assert 'Iter(test)' not in proc.stdout + proc.stderr
    assert json.loads((out / 'fourier.json').read_text()) == data
    # another grid is another study: refused, not mixed
    proc = run_tool_here(tool, 'fourier', *common, '--grid', '5', '--out-dir', out, check=False)
    assert proc.returncode != 0 and 'another study' in proc.stderr

    masked = tmp_path / 'masking'
    run_tool_here(tool, 'masking', *common, '--ratios', '0', '1', '--out-dir', masked)
    settings = json.loads((masked / 'masking.json').read_text())['settings']
    assert settings['mask:0'] == settings['clean']
    assert settings['mask:1']['coco/bbox_mAP'] < settings['clean']['coco/bbox_mAP']
    assert (masked / 'masking.png').is_file()
