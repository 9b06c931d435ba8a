"""VQGAN tokenizer: variants, official key layouts, safe Lightning checkpoints, quantiser."""
import json
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from mmrobust.models.checkpoint import CheckpointMismatchError
from mmrobust.models.tokenizers import VQGAN, VQGAN_ARCHS, load_tokenizer_checkpoint
from mmrobust.utils import UnsafeCheckpointError

KEYS_DIR = Path(__file__).resolve().parent / 'data' / 'vqgan_keys'
# parameters and state-dict tensors of the official files (spec), tokenizer part only
OFFICIAL = {'f16_1024': (72_141_699, 343, 'taming_vqgan_f16_1024'),
            'f16_16384': (76_073_859, 343, None),
            'f8_16384': (67_717_295, 299, 'taming_vqgan_f8_16384')}


def _meta(arch: str) -> VQGAN:
    with torch.device('meta'):
        return VQGAN(arch)


@pytest.mark.parametrize('arch', sorted(OFFICIAL))
def test_official_variants_match_parameter_counts_and_key_layout(arch):
    params, tensors, keys_file = OFFICIAL[arch]
    model = _meta(arch)
    assert sum(p.numel() for p in model.parameters()) == params
    assert len(model.state_dict()) == tensors
    if keys_file:
        layout = {k: tuple(shape) for k, shape, _ in
                  json.loads((KEYS_DIR / f'{keys_file}.keys.json').read_text())}
        assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == layout


def test_small_tokenizer_is_dr_vits_small_encoder():
    model = _meta('small_f16')
    encoder = sum(p.numel() for p in model.encoder.parameters())
    assert 2.0e6 < encoder < 3.5e6  # "1 res block per level, 64 filters, ~3M parameters"
    assert model.factor == 16 and model.n_embed == 1024 and model.embed_dim == 256


def _fake_lightning_modules():
    """Classes under Lightning's module names, as the official .ckpt files pickle them."""
    callbacks = types.ModuleType('pytorch_lightning.callbacks.model_checkpoint')
    parsing = types.ModuleType('pytorch_lightning.utilities.parsing')

    class ModelCheckpoint:
        pass

    class AttributeDict(dict):
        pass

    for cls, module in ((ModelCheckpoint, callbacks), (AttributeDict, parsing)):
        cls.__module__, cls.__qualname__ = module.__name__, cls.__name__
    callbacks.ModelCheckpoint, parsing.AttributeDict = ModelCheckpoint, AttributeDict
    packages = {name: types.ModuleType(name) for name in (
        'pytorch_lightning', 'pytorch_lightning.callbacks', 'pytorch_lightning.utilities')}
    return {**packages, callbacks.__name__: callbacks, parsing.__name__: parsing}


def _official_layout_checkpoint(path: Path, keys_file: str, extra: dict = None) -> dict:
    """A Lightning-style checkpoint with the official key layout (plus loss.* weights)."""
    torch.manual_seed(0)
    state = {k: torch.randn(shape) for k, shape, _ in
             json.loads((KEYS_DIR / f'{keys_file}.keys.json').read_text())}
    state['loss.discriminator.main.0.weight'] = torch.randn(64, 3, 4, 4)
    state['loss.perceptual_loss.net.slice1.0.weight'] = torch.randn(64, 3, 3, 3)
    modules = _fake_lightning_modules()
    sys.modules.update(modules)
    try:
        ckpt = {'epoch': 3, 'global_step': 1000, 'pytorch-lightning_version': '1.0.8',
                'callbacks': {modules['pytorch_lightning.callbacks.model_checkpoint']
                              .ModelCheckpoint: {'best_model_score': torch.tensor(0.1)}},
                'hyper_parameters': modules['pytorch_lightning.utilities.parsing']
                .AttributeDict(lr=4.5e-6), 'optimizer_states': [{'state': {}}],
                'state_dict': state, **(extra or {})}
        torch.save(ckpt, path)
    finally:
        for name in modules:
            del sys.modules[name]  # loading must not need (or import) Lightning
    return state


def test_lightning_checkpoint_loads_strictly_without_lightning(tmp_path):
    path = tmp_path / 'last.ckpt'
    state = _official_layout_checkpoint(path, 'taming_vqgan_f8_16384')
    assert 'pytorch_lightning' not in sys.modules
    model = VQGAN('f8_16384', checkpoint=str(path))
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key
    # the same through init_cfg, as configs use it
    model = VQGAN('f8_16384', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    assert torch.equal(model.quantize.embedding.weight, state['quantize.embedding.weight'])
    # a plain state dict (e.g. from tools/train_vq.py) loads too
    torch.save({k: v for k, v in state.items() if not k.startswith('loss.')}, tmp_path / 'p.pth')
    VQGAN('f8_16384', checkpoint=str(tmp_path / 'p.pth'))


def test_checkpoint_mismatch_lists_keys(tmp_path):
    path = tmp_path / 'last.ckpt'
    _official_layout_checkpoint(path, 'taming_vqgan_f8_16384')
    with pytest.raises(CheckpointMismatchError, match='missing keys .*unexpected keys .*shape'):
        VQGAN('f16_1024', checkpoint=str(path))  # another architecture
    state = load_tokenizer_checkpoint(str(path))
    state['encoder.conv_in.weights'] = state.pop('encoder.conv_in.weight')
    torch.save({'state_dict': state}, tmp_path / 'renamed.pth')
    with pytest.raises(CheckpointMismatchError) as err:
        VQGAN('f8_16384', checkpoint=str(tmp_path / 'renamed.pth'))
    message = str(err.value)
    assert 'encoder.conv_in.weight' in message and 'encoder.conv_in.weights' in message
    with pytest.raises(FileNotFoundError):
        VQGAN('small_f16', checkpoint=str(tmp_path / 'absent.ckpt'))


class _Payload:
    def __reduce__(self):
        return (os.system, ('echo pwned > pwned.txt', ))


def test_malicious_checkpoint_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / 'evil.ckpt'
    _official_layout_checkpoint(path, 'taming_vqgan_f8_16384', extra={'x': _Payload()})
    with pytest.raises(UnsafeCheckpointError, match='system'):
        VQGAN('f8_16384', checkpoint=str(path))
    assert not (tmp_path / 'pwned.txt').exists()


def test_encode_decode_shapes_chunking_and_errors():
    torch.manual_seed(0)
    model = VQGAN('small_f16', chunk_size=2).eval()
    x = torch.rand(5, 3, 64, 96)
    with torch.no_grad():
        codes = model.encode(x)
        assert codes.shape == (5, 4, 6) and codes.dtype == torch.long
        assert int(codes.max()) < model.n_embed
        images = model.decode(codes)
        assert images.shape == x.shape and images.min() >= 0 and images.max() <= 1
        model.chunk_size = 8
        assert torch.equal(model.encode(x), codes)
        assert torch.allclose(model.reconstruct(x), images, atol=1e-5)
    with pytest.raises(ValueError, match='divisible by 16'):
        model.encode(torch.rand(1, 3, 40, 64))
    with pytest.raises(ValueError, match=r'\(B, 3, H, W\)'):
        model.encode(torch.rand(1, 1, 64, 64))
    with pytest.raises(KeyError, match='f16_1024'):
        VQGAN('f32')


def test_quantizer_distances_stay_fp32_under_autocast():
    torch.manual_seed(0)
    model = VQGAN('small_f16', autocast=True).eval()
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        z = model.encode_latent(x)
        assert z.dtype == torch.float32
        flat = z.double().permute(0, 2, 3, 1).reshape(-1, model.embed_dim)
        brute = torch.cdist(flat, model.quantize.embedding.weight.double()).argmin(1)
        assert torch.equal(model.quantize.indices(z).reshape(-1), brute)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            assert torch.equal(model.quantize.indices(z).reshape(-1), brute)


@pytest.mark.parametrize('native', [True, False])
def test_autocast_only_where_the_cpu_runs_bfloat16_natively(native, monkeypatch):
    import mmrobust.models.tokenizers.vqgan as vqgan
    monkeypatch.setattr(vqgan, 'cpu_has_native_bf16', lambda: native)
    model = VQGAN('small_f16', autocast=True).eval()
    dtypes = []
    model.encoder.conv_in.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    with torch.no_grad():
        model.encode(torch.rand(1, 3, 32, 32))
        model.encode(torch.rand(1, 3, 32, 32))
    # NOTE: emulated bf16 (AVX2) is ~100x slower than fp32, so the tokenizer falls back
    assert dtypes == [torch.bfloat16 if native else torch.float32] * 2
    assert model._amp_fallback_logged == (not native)  # the fallback is logged, once


def test_vq_loss_and_straight_through_gradients():
    torch.manual_seed(0)
    model = VQGAN(dict(VQGAN_ARCHS['small_f16'], n_embed=16)).train()
    x = torch.rand(2, 3, 32, 32)
    rec, vq_loss, codes = model(x)
    assert rec.shape == x.shape and vq_loss.ndim == 0 and vq_loss > 0
    ((rec - x) ** 2).mean().add(vq_loss).backward()
    assert model.encoder.conv_in.weight.grad.abs().sum() > 0  # through the straight-through z_q
    assert model.decoder.conv_out.weight.grad.abs().sum() > 0
    used = model.quantize.embedding.weight.grad.abs().sum(1) > 0
    assert torch.equal(used, torch.bincount(codes.flatten(), minlength=16) > 0)


def test_batchnorm_variant_and_norm_errors(tmp_path):
    arch = dict(VQGAN_ARCHS['small_f16'], ch=16, n_embed=16, norm='batch')
    model = VQGAN(arch).train()
    norms = [m for m in model.modules()
             if isinstance(m, (torch.nn.GroupNorm, torch.nn.BatchNorm2d))]
    assert norms and all(isinstance(m, torch.nn.BatchNorm2d) for m in norms)
    x = torch.rand(4, 3, 32, 32)
    model(x)  # training updates the running statistics ...
    model.eval()
    # ... and in eval mode an image's codes do not depend on the rest of the batch
    assert torch.equal(model.encode(x)[:1], model.encode(x[:1]))
    torch.save(model.state_dict(), tmp_path / 'bn.pth')
    loaded = VQGAN(arch, checkpoint=str(tmp_path / 'bn.pth')).eval()
    assert torch.equal(loaded.encode(x), model.encode(x))
    # a GroupNorm checkpoint does not load into the BatchNorm model: the keys are listed
    torch.save(VQGAN(dict(arch, norm='group')).state_dict(), tmp_path / 'gn.pth')
    with pytest.raises(CheckpointMismatchError, match='running_mean'):
        VQGAN(arch, checkpoint=str(tmp_path / 'gn.pth'))
    with pytest.raises(ValueError, match="norm must be one of"):
        VQGAN(dict(arch, norm='layer'))
    with pytest.raises(KeyError,
                       match=r"optionally \['norm'\]\); missing: \[\], unknown: \['norms'\]"):
        VQGAN(dict(arch, norms='batch'))
