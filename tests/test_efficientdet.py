"""EfficientDet (BiFPN, EfficientDetHead, EfficientNet-Lite) as built from the configs."""
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope

from mmrobust.models import BiFPN, EfficientDetHead, EfficientNetLite

from helpers import REPO

BASES = {'d0': 'configs/efficientdet/_base_/efficientdet-d0.py',
         'lite0': 'configs/efficientdet/_base_/efficientdet-lite0.py'}


def build(arch: str, num_classes: int = 80):
    cfg = Config.fromfile(str(REPO / BASES[arch]))
    cfg.model.backbone.init_cfg = None
    cfg.model.bbox_head.num_classes = num_classes
    init_default_scope('mmdet')
    return MODELS.build(cfg.model)


def n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize('arch,num_classes,expected,tol', [
    ('d0', 90, 3.9e6, 0.02),     # the paper's D0 (COCO's 90 category ids)
    ('d0', 80, 3.9e6, 0.02),
    ('lite0', 90, 3.2e6, 0.02),  # TF model zoo's EfficientDet-Lite0
])
def test_parameter_counts(arch, num_classes, expected, tol):
    model = build(arch, num_classes)
    assert abs(n_params(model) - expected) / expected <= tol, n_params(model)
    # no unused layers: B0/Lite0 stop at the 320-channel stage (P5)
    assert len(model.backbone.layers) == 6


def test_lite_backbone_has_no_squeeze_excite_and_relu6():
    lite = EfficientNetLite(out_indices=(3, 4, 5))
    names = [n for n, _ in lite.named_modules()]
    assert not any('.se' in n for n in names)
    assert any(isinstance(m, torch.nn.ReLU6) for m in lite.modules())
    with pytest.raises(AssertionError, match='lite0'):
        EfficientNetLite(arch='lite3')


@pytest.mark.parametrize('arch', sorted(BASES))
def test_odd_input_sizes_levels_and_gradients(arch):
    model = build(arch, num_classes=5).train()
    model.init_weights()
    x = torch.randn(2, 3, 97, 161)
    feats = model.neck(model.backbone(x))
    assert [f.shape[1] for f in feats] == [64] * 5
    # strides 8 .. 128 (ceil division, as stride-2 'same' convolutions)
    assert [tuple(f.shape[-2:]) for f in feats] == [
        (-(-97 // s), -(-161 // s)) for s in (8, 16, 32, 64, 128)]
    cls_scores, bbox_preds = model.bbox_head(feats)
    assert [c.shape[1] for c in cls_scores] == [9 * 5] * 5
    assert [b.shape[1] for b in bbox_preds] == [9 * 4] * 5
    loss = sum(c.float().mean() for c in cls_scores) + sum(b.float().mean() for b in bbox_preds)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, missing


def test_head_keeps_one_norm_per_level_and_prior_bias():
    # NOTE: the head builds mmdet's coders and losses by name: in mmdet's scope, whatever scope
    # an earlier test in this process (an xdist worker) left current
    init_default_scope('mmdet')
    head = EfficientDetHead(num_classes=3, in_channels=64)
    head.init_weights()
    assert len(head.cls_norms) == 5 and len(head.cls_norms[0]) == 3
    assert head.cls_norms[0][0] is not head.cls_norms[1][0]
    prob = torch.sigmoid(head.cls_pred.pointwise.bias)
    torch.testing.assert_close(prob, torch.full_like(prob, 0.01))
    with pytest.raises(ValueError, match='5 levels'):
        head(tuple(torch.randn(1, 64, 4, 4) for _ in range(3)))


def test_bifpn_fusion_weights_are_normalised_and_inputs_checked():
    neck = BiFPN(in_channels=[40, 112, 320], out_channels=64, num_layers=2).eval()
    node = neck.layers[0].bottom_up[0]
    with torch.no_grad():
        node.weights.copy_(torch.tensor([-1.0, 2.0, 2.0]))  # a negative weight counts as 0
    a, b, c = (torch.full((1, 64, 4, 4), v) for v in (100., 1., 3.))
    fused = []
    node.conv.register_forward_pre_hook(lambda m, inp: fused.append(inp[0]))
    node.act = torch.nn.Identity()
    node([a, b, c])
    torch.testing.assert_close(fused[0], torch.full_like(a, (2 * 1 + 2 * 3) / (4 + 1e-4)))
    with pytest.raises(ValueError, match='expects 3 maps'):
        neck((torch.randn(1, 40, 8, 8),))
