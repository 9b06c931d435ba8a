"""No silent path in corruption writing and in DAT.

What used to be recorded wrongly or dropped without a word now stops, refuses or is counted.
"""
import errno
import json

import numpy as np
import pytest
from PIL import Image

from mmrobust.corruptions import resolve_protocol
from mmrobust.corruptions.generate import MANIFEST, generate, read_image


def _source(tmp_path, n: int = 3):
    src = tmp_path / 'src'
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (24, 32, 3), np.uint8)).save(src / f'{i}.png')
    Image.fromarray(rng.integers(0, 255, (24, 32, 3), np.uint8)).convert('P').save(
        src / 'palette.png')
    return src


def test_a_full_disk_stops_the_run_naming_the_cell_and_image(tmp_path, monkeypatch):
    """A full disk stops the run instead of failing image after image.

    Before: 'No space left on device' was recorded as a failed source per image and the run went on
    over every image.
    """
    from mmrobust.corruptions import generate as module
    src = _source(tmp_path)
    calls = []

    def full_disk(path, data, fsync=True):
        calls.append(path)
        if len(calls) >= 3:
            raise OSError(errno.ENOSPC, 'No space left on device')
        return real(path, data, fsync)
    real = module.atomic_bytes
    monkeypatch.setattr(module, 'atomic_bytes', full_disk)
    protocol = resolve_protocol(None, ['contrast', 'fog'], [1])
    with pytest.raises(module.CorruptionWriteError,
                       match=r'(contrast|fog) 1 of .*png failed: OSError.*No space left.*rerun'):
        generate(src, tmp_path / 'out', protocol, progress=False)
    assert len(calls) == 3  # it stopped at the first failure, not after every image


def test_a_resume_with_other_settings_is_refused(tmp_path):
    from mmrobust.utils.io import ResultsMismatchError
    src = _source(tmp_path)
    protocol = resolve_protocol(None, ['contrast'], [1])
    generate(src, tmp_path / 'out', protocol, progress=False)
    for option, value in (('seed', 1), ('channel_order', 'bgr'), ('jpeg_quality', 80),
                          ('lossless', True)):
        with pytest.raises(ResultsMismatchError, match=f'{option}: .*this run {value!r}'):
            generate(src, tmp_path / 'out', protocol, progress=False, **{option: value})
    # another protocol into the same folder with the same settings is fine
    generate(src, tmp_path / 'out', resolve_protocol(None, ['fog'], [2]), progress=False)


def test_a_resumed_run_keeps_the_earlier_conversions(tmp_path):
    src = _source(tmp_path)
    protocol = resolve_protocol(None, ['contrast'], [1])
    first = generate(src, tmp_path / 'out', protocol, progress=False)
    assert 'palette.png' in first['converted']
    again = generate(src, tmp_path / 'out', protocol, progress=False)  # nothing to write
    assert again['counts']['written_this_run'] == 0
    assert again['converted'] == first['converted']
    assert json.loads((tmp_path / 'out' / MANIFEST).read_text())['converted'] == \
        first['converted']


def test_mode_i_images_within_8_bits_are_not_16_bit(tmp_path):
    values = np.arange(24 * 32, dtype=np.int32).reshape(24, 32) % 256
    Image.fromarray(values, mode='I').save(tmp_path / 'i.tif')
    img, conversion = read_image(tmp_path / 'i.tif')
    assert np.array_equal(img, values.astype(np.uint8))  # not their (zero) high byte
    assert conversion is None or '16-bit' not in conversion


def test_dat_refuses_a_random_start_it_would_drop():
    """Before: accepted, the start silently skipped, the log saying 'random start 0.8'."""
    from test_dat import ScalarQuantizer

    from mmrobust.engine import DATHook
    for kwargs in (dict(norm='linf'), dict(alpha=0.0, eps=0.0)):
        with pytest.raises(ValueError, match='random_start'):
            DATHook(tokenizer=ScalarQuantizer(), random_start=True, random_start_prob=0.8,
                    **kwargs)
    DATHook(tokenizer=ScalarQuantizer(), norm='linf')  # without the start: fine


@pytest.mark.parametrize('norm', ['l2', 'linf'])
def test_a_non_finite_gradient_skips_that_images_attack(norm):
    """Before: nan_to_num turned an overflowed (inf) gradient into a maximal step on one pixel."""
    import torch
    from test_dat import ScalarQuantizer

    from mmrobust.engine import DATHook
    hook = DATHook(tokenizer=ScalarQuantizer(), norm=norm, alpha=0.1, eps=0.1)
    grad = torch.randn(3, 3, 8, 8)
    grad[1, 0, 2, 2] = float('inf')
    grad[2, 1, 0, 0] = float('nan')
    mask = torch.ones(3, 1, 8, 8, dtype=torch.bool)
    delta = hook.perturbation(grad, mask, None)
    assert torch.equal(delta[1:], torch.zeros_like(delta[1:]))  # not attacked
    assert delta[0].abs().sum() > 0  # the finite image is
    assert hook.skipped_nonfinite == 2


def test_vqgan_without_autocast_stays_fp32_inside_the_trainers_autocast():
    """Before: VQGAN(autocast=False) ran its convolutions in the outer --amp autocast's dtype."""
    import torch

    from mmrobust.models.tokenizers.vqgan import VQGAN
    model = VQGAN('small_f16', autocast=False).eval()
    dtypes = []
    model.encoder.conv_in.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        model.encode(torch.rand(1, 3, 32, 32))
    assert dtypes == [torch.float32]
