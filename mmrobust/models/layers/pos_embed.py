"""Fourier positional encoding (XCiT / FAN): resolution-free, so no table to resample."""
import math

import torch
import torch.nn as nn


def fourier_features(h: int, w: int, dim: int = 32, temperature: float = 10000.,
                     legacy: bool = False, device=None, dtype=torch.float32) -> torch.Tensor:
    """Sin/cos features of the normalised (y, x) grid position, shape (1, 2 * dim, h, w).

    Args:
        h: Grid height.
        w: Grid width.
        dim: Features per axis.
        temperature: Base of the frequency progression.
        legacy: Use ``temperature ** (k / dim)`` for frequency k (the formula of upstream FAN's
            dense-prediction code) instead of ``temperature ** (2 * (k // 2) / dim)`` (the one the
            released ImageNet weights were trained with).
        device: Device of the features.
        dtype: Data type of the features.
    """
    scale, eps = 2 * math.pi, 1e-6
    y = torch.arange(1, h + 1, device=device, dtype=torch.float32) / (h + eps) * scale
    x = torch.arange(1, w + 1, device=device, dtype=torch.float32) / (w + eps) * scale
    k = torch.arange(dim, device=device, dtype=torch.float32)
    expo = k / dim if legacy else 2 * torch.div(k, 2, rounding_mode='floor') / dim
    dim_t = temperature ** expo

    def encode(pos: torch.Tensor) -> torch.Tensor:  # (L,) -> (L, dim), sin/cos interleaved
        p = pos[:, None] / dim_t
        return torch.stack((p[:, 0::2].sin(), p[:, 1::2].cos()), dim=2).flatten(1)

    fy = encode(y)[:, None, :].expand(h, w, dim)
    fx = encode(x)[None, :, :].expand(h, w, dim)
    return torch.cat((fy, fx), dim=2).permute(2, 0, 1).unsqueeze(0).to(dtype)


class PositionalEncodingFourier(nn.Module):
    """Fourier features of the token grid projected to the embedding width by a 1x1 conv.

    Args:
        embed_dim: Output channels.
        hidden_dim: Features per axis (the projection sees 2 * hidden_dim channels).
        temperature: Base of the frequency progression.
        legacy: See :func:`fourier_features`.
    """

    def __init__(self, embed_dim: int, hidden_dim: int = 32, temperature: float = 10000.,
                 legacy: bool = False) -> None:
        super().__init__()
        self.token_projection = nn.Conv2d(hidden_dim * 2, embed_dim, kernel_size=1)
        self.hidden_dim = hidden_dim
        self.temperature = temperature
        self.legacy = legacy

    def forward(self, h: int, w: int) -> torch.Tensor:
        """Encoding of an h x w grid, shape (1, embed_dim, h, w)."""
        weight = self.token_projection.weight
        feats = fourier_features(h, w, self.hidden_dim, self.temperature, self.legacy,
                                 device=weight.device, dtype=weight.dtype)
        return self.token_projection(feats)
