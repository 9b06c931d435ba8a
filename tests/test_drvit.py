"""Dr-ViT backbone: variants, token modes, pyramid, freezing, checkpointing, timm weights."""
import math

import pytest
import torch

from mmrobust.models.backbones.drvit import TOKEN_MODES, DrViT
from mmrobust.models.checkpoint import CheckpointMismatchError

# a tiny f16 tokenizer (random weights: the backbone's behaviour does not depend on them)
TOKENIZER = dict(type='VQGAN', arch=dict(ch=32, ch_mult=(1, 1, 2, 2, 2), num_res_blocks=1,
                                         attn_resolutions=(), resolution=256, z_channels=256,
                                         embed_dim=256, n_embed=64))
# timm / DeiT ViT-Ti/S/B at 224 (parameters with the 1000-class head), and their widths
DEIT = {'tiny': (5_717_416, 192), 'small': (22_050_664, 384), 'base': (86_567_656, 768)}


def _build(arch: str = 'small', **kwargs) -> DrViT:
    torch.manual_seed(0)
    kwargs.setdefault('tokenizer', TOKENIZER)
    model = DrViT(arch, **kwargs)
    model.init_weights()
    return model


@pytest.mark.parametrize('arch', sorted(DEIT))
def test_transformer_matches_deit_parameter_counts(arch):
    """The transformer (cls, position, blocks, norm) is DeiT's minus its patch embedding/head."""
    total, dim = DEIT[arch]
    patch_embed, head = dim * 3 * 16 * 16 + dim, dim * 1000 + 1000
    with torch.device('meta'):
        model = DrViT(arch, tokenizer=TOKENIZER)
    transformer = sum(p.numel() for n, p in model.named_parameters()
                      if n.startswith(('cls_token', 'pos_embed', 'blocks.', 'norm.')))
    assert transformer == total - patch_embed - head
    assert [i['num_chs'] for i in model.feature_info] == [dim // 4, dim // 2, dim, dim]
    assert [i['reduction'] for i in model.feature_info] == [4, 8, 16, 32]
    assert model.token_mode == ('discrete' if arch == 'tiny' else 'concat')


@pytest.mark.parametrize('mode', TOKEN_MODES)
def test_token_modes_shapes_and_gradients(mode):
    model = _build('tiny' if mode == 'discrete' else 'small', token_mode=mode,
                   drop_path_rate=0.0).train()
    x = torch.randn(2, 3, 97, 161)
    outs = model(x)
    assert [tuple(o.shape) for o in outs] == [
        (2, c, math.ceil(97 / s), math.ceil(161 / s))
        for c, s in ((i['num_chs'], i['reduction']) for i in model.feature_info)]
    assert all(torch.isfinite(o).all() and o.is_contiguous() for o in outs)
    sum(o.mean() for o in outs).backward()
    for name, param in model.named_parameters():
        if name.startswith('tokenizer.'):
            assert not param.requires_grad and param.grad is None, name  # stop-gradient
        else:
            assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_concat_tokens_are_pixel_code_and_zeros():
    model = _build('small', drop_path_rate=0.0).eval()
    x = torch.randn(1, 3, 64, 64)
    tokens = model._tokens(x)
    images = (x * model.img_std + model.img_mean).clamp(0, 1)
    codes = model.tokenizer.encode(images)
    assert torch.equal(tokens[:, :32], model.pixel_embed(x))
    codebook = model.tokenizer.quantize.embedding.weight
    assert torch.equal(tokens[:, 32:288], codebook[codes].permute(0, 3, 1, 2))  # delta starts 0
    assert tokens[:, 288:].abs().sum() == 0


def test_f8_tokenizer_is_reduced_to_the_patch_grid():
    f8 = dict(TOKENIZER, arch=dict(TOKENIZER['arch'], ch_mult=(1, 1, 2, 2)))
    model = _build('small', tokenizer=f8)
    assert model.code_reduce is not None
    assert model._tokens(torch.randn(1, 3, 64, 96)).shape == (1, 384, 4, 6)


def test_with_cp_drop_path_frozen_stages_and_out_indices():
    x = torch.randn(1, 3, 64, 64)
    plain = _build(drop_path_rate=0.0).train()
    ckpt = _build(drop_path_rate=0.0, with_cp=True).train()
    for a, b in zip(plain(x), ckpt(x)):
        assert torch.allclose(a, b, atol=1e-6)
    stochastic = _build(drop_path_rate=0.5).train()
    assert not torch.equal(stochastic(x)[2], stochastic(x)[2])
    stochastic.eval()
    assert torch.equal(stochastic(x)[2], stochastic(x)[2])

    frozen = _build(frozen_stages=2).train()
    trainable = {n for n, p in frozen.named_parameters() if p.requires_grad}
    assert not any(n.startswith(('pixel_embed', 'cls_token', 'pos_embed', 'code_delta',
                                 'tokenizer.')) for n in trainable)
    assert not any(n.startswith(f'blocks.{i}.') for i in range(6) for n in trainable)
    assert all(any(n.startswith(f'blocks.{i}.') for n in trainable) for i in range(6, 12))
    assert frozen.blocks[0].training is False and frozen.blocks[11].training is True

    two = _build(out_indices=(1, 3))
    assert [o.shape[1] for o in two(x)] == [192, 384]
    with pytest.raises(ValueError, match='out_indices'):
        DrViT('small', tokenizer=TOKENIZER, out_indices=(4, ))


def _timm_vit_state(dim: int, grid: int, depth: int = 12) -> dict:
    torch.manual_seed(1)
    state = {'cls_token': torch.randn(1, 1, dim), 'pos_embed': torch.randn(1, 1 + grid ** 2, dim),
             'patch_embed.proj.weight': torch.randn(dim, 3, 16, 16),
             'patch_embed.proj.bias': torch.randn(dim), 'norm.weight': torch.randn(dim),
             'norm.bias': torch.randn(dim), 'head.weight': torch.randn(1000, dim),
             'head.bias': torch.randn(1000)}
    for i in range(depth):
        p = f'blocks.{i}.'
        state.update({p + 'norm1.weight': torch.randn(dim), p + 'norm1.bias': torch.randn(dim),
                      p + 'attn.qkv.weight': torch.randn(3 * dim, dim),
                      p + 'attn.qkv.bias': torch.randn(3 * dim),
                      p + 'attn.proj.weight': torch.randn(dim, dim),
                      p + 'attn.proj.bias': torch.randn(dim),
                      p + 'norm2.weight': torch.randn(dim), p + 'norm2.bias': torch.randn(dim),
                      p + 'mlp.fc1.weight': torch.randn(4 * dim, dim),
                      p + 'mlp.fc1.bias': torch.randn(4 * dim),
                      p + 'mlp.fc2.weight': torch.randn(dim, 4 * dim),
                      p + 'mlp.fc2.bias': torch.randn(dim)})
    return state


def test_loads_timm_vit_strictly_with_position_resampling(tmp_path):
    state = _timm_vit_state(384, grid=24)  # a 384-px checkpoint into a 224-px model
    torch.save({'model': state}, tmp_path / 'deit_s_384.pth')
    model = _build('small', init_cfg=dict(type='Pretrained',
                                          checkpoint=str(tmp_path / 'deit_s_384.pth')))
    assert torch.equal(model.blocks[5].attn.qkv.weight, state['blocks.5.attn.qkv.weight'])
    assert torch.equal(model.cls_token, state['cls_token'])
    assert model.pos_embed.shape == (1, 197, 384)
    assert torch.equal(model.pos_embed[:, :1], state['pos_embed'][:, :1])
    # the plain patch embedding is the pixel embedding of a 'pixel' (plain ViT) model
    plain = _build('small', token_mode='pixel', tokenizer=None, init_cfg=dict(
        type='Pretrained', checkpoint=str(tmp_path / 'deit_s_384.pth')))
    assert torch.equal(plain.pixel_embed.weight, state['patch_embed.proj.weight'])

    del state['blocks.7.mlp.fc2.bias']
    torch.save(state, tmp_path / 'broken.pth')
    with pytest.raises(CheckpointMismatchError, match=r'blocks\.7\.mlp\.fc2\.bias'):
        _build('small', init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'broken.pth')))
    torch.save(_timm_vit_state(192, grid=14), tmp_path / 'tiny.pth')
    with pytest.raises(CheckpointMismatchError, match='shape'):
        _build('small', init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'tiny.pth')))


def test_converter_reports_what_a_deit_checkpoint_leaves_out():
    from mmrobust.apis.convert import convert_checkpoint
    state = _timm_vit_state(192, grid=14)
    state.update({'head.weight': torch.randn(1000, 192), 'head.bias': torch.randn(1000)})
    conv = convert_checkpoint('drvit', {'model': state}, arch='tiny')
    assert set(conv.dropped) == {'head.weight', 'head.bias', 'patch_embed.proj.weight',
                                 'patch_embed.proj.bias'}
    assert 'classifier' in conv.dropped['head.weight']
    assert "token_mode='discrete'" in conv.dropped['patch_embed.proj.weight']
    assert torch.equal(conv.model.blocks[11].mlp.fc2.weight, state['blocks.11.mlp.fc2.weight'])
    assert any(k.startswith('pyramid.') for k in conv.new)


def test_configuration_errors():
    with pytest.raises(ValueError, match='needs a tokenizer'):
        DrViT('small')
    with pytest.raises(ValueError, match='token_mode'):
        DrViT('small', tokenizer=TOKENIZER, token_mode='sum')
    f32 = dict(TOKENIZER, arch=dict(TOKENIZER['arch'], ch_mult=(1, 1, 1, 2, 2, 2)))
    with pytest.raises(ValueError, match='16 .* or 8'):
        DrViT('small', tokenizer=f32)
    with pytest.raises(KeyError, match='unknown DrViT arch'):
        DrViT('huge', tokenizer=TOKENIZER)


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_registered_in_both_scopes(scope):
    registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
    model = registry.build(dict(type='DrViT', arch='tiny', tokenizer=TOKENIZER))
    assert isinstance(model, DrViT)


def test_tokenizer_checkpoint_loads_at_init(tmp_path):
    from mmrobust.models.tokenizers import VQGAN
    torch.manual_seed(3)
    trained = VQGAN(TOKENIZER['arch'])
    torch.save(trained.state_dict(), tmp_path / 'tokenizer.pth')
    tokenizer = dict(TOKENIZER, init_cfg=dict(type='Pretrained',
                                              checkpoint=str(tmp_path / 'tokenizer.pth')))
    model = _build('small', tokenizer=tokenizer)
    assert torch.equal(model.tokenizer.quantize.embedding.weight,
                       trained.quantize.embedding.weight)
    assert not model.tokenizer.training and not any(
        p.requires_grad for p in model.tokenizer.parameters())
    # a missing tokenizer file says what to run
    missing = dict(TOKENIZER, init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'no.pth')))
    with pytest.raises(FileNotFoundError, match=r'no\.pth.*tools/train_vq\.py'):
        _build('small', tokenizer=missing)
