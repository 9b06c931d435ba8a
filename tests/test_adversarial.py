"""The adversarial step shared by DAT and the attack cells (mmrobust.models.adversarial).

The random starts' laws, the non-finite guard, the input gradient. (DAT and the attacks taking the
same step: tests/test_evaluation/test_attacks.py.)
"""
import math

import pytest
import torch

from mmrobust.models import adversarial


def _ks_uniform(values: torch.Tensor) -> float:
    """Kolmogorov-Smirnov distance of ``values`` from U(0, 1)."""
    v = values.sort().values.double()
    n = len(v)
    upper = torch.arange(1, n + 1, dtype=torch.float64) / n
    return float(torch.maximum(upper - v, v - (upper - 1 / n)).max())


def test_the_l2_random_start_is_uniform_in_the_ball_over_the_valid_area():
    """Uniform in a d-ball: the direction over the valid values alone and (r / ε)^d ~ U(0, 1).

    Before: the radius was U(0, ε) and the direction normalised over the padded tensor.
    """
    mask = torch.zeros(1, 4, 5, dtype=torch.bool)
    mask[:, :3, :3] = True  # d = 3 channels x 9 valid pixels
    d, eps, draws = 27, 0.5, 2000
    gen = torch.Generator().manual_seed(0)
    points = torch.stack([adversarial.random_start('l2', eps, mask, gen) for _ in range(draws)])
    assert torch.all(points[..., 3:, :] == 0) and torch.all(points[..., :, 3:] == 0)
    radius = points.flatten(1).norm(dim=1)
    assert float(radius.max()) <= eps * (1 + 1e-6)
    assert _ks_uniform((radius / eps) ** d) < 1.36 / math.sqrt(draws)  # 95%
    # the direction is uniform on the sphere: each coordinate's mean is 0, its square's 1/d
    unit = points.flatten(1)[:, mask.expand(3, 4, 5).flatten()] / radius[:, None]
    assert float(unit.mean(0).abs().max()) < 4 / math.sqrt(d * draws)
    assert float((unit ** 2).mean()) == pytest.approx(1 / d, rel=1e-6)


def test_the_linf_random_start_is_uniform_in_the_cube_over_the_valid_area():
    mask = torch.zeros(1, 6, 6, dtype=torch.bool)
    mask[:, :4, :5] = True
    gen = torch.Generator().manual_seed(1)
    points = torch.stack([adversarial.random_start('linf', 0.1, mask, gen) for _ in range(200)])
    assert torch.all(points * ~mask == 0)
    valid = points[:, :, :4, :5]
    assert float(valid.abs().max()) <= 0.1
    assert _ks_uniform((valid.flatten() + 0.1) / 0.2) < 1.36 / math.sqrt(valid.numel())


def test_a_non_finite_gradient_gives_no_step_to_its_image_alone():
    grad = torch.randn(3, 3, 4, 4)
    grad[1, 0, 0, 0] = float('inf')
    grad[2, 1, 2, 3] = float('nan')
    mask = torch.ones(3, 1, 4, 4, dtype=torch.bool)
    assert adversarial.finite_images(grad).flatten().tolist() == [True, False, False]
    for norm in ('linf', 'l2'):
        move = adversarial.step_direction(grad, norm, mask)
        assert torch.all(move[1:] == 0) and torch.isfinite(move).all()
        assert torch.equal(move[0], grad[0].sign()) if norm == 'linf' else \
            float(move[0].norm()) == pytest.approx(1.0)


def test_input_gradient_touches_no_parameter_and_matches_autograd():
    layer = torch.nn.Conv2d(3, 2, 3)
    x = torch.randn(2, 3, 5, 5)

    def loss(inputs):
        return layer(inputs).pow(2).mean()
    grad, value = adversarial.input_gradient(loss, x)
    assert layer.weight.grad is None and not x.requires_grad
    ref = x.clone().requires_grad_(True)
    loss(ref).backward()
    torch.testing.assert_close(grad, ref.grad)
    assert value == pytest.approx(float(loss(x)))
