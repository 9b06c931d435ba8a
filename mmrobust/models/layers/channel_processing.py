"""FAN's attentional channel processing (Zhou et al. 2022, Eq. 7).

Shared by FAN-Hybrid and FAN-Swin.
"""
import torch
import torch.nn as nn
from typing_extensions import override


class DWConvBN(nn.Module):
    """Depthwise 3x3 conv -> GELU -> BatchNorm -> depthwise 3x3 conv on a token grid."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.act = nn.GELU()
        self.bn = nn.BatchNorm2d(dim)
        self.conv2 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    @override
    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, c = x.shape
        x = x.transpose(1, 2).reshape(b, c, h, w)
        x = self.conv2(self.bn(self.act(self.conv1(x))))
        return x.flatten(2).transpose(1, 2)


class MlpDWBN(nn.Module):
    """fc1 -> (residual) layer-scaled depthwise-conv branch -> fc2.

    Args:
        in_chs: Input (and output) channels.
        hidden_chs: Hidden channels (4x input in FAN).
        residual: Add the depthwise branch to its input (FAN-Hybrid) or replace it (FAN-Swin).
    """

    def __init__(self, in_chs: int, hidden_chs: int, residual: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_chs, hidden_chs)
        self.dwconv = DWConvBN(hidden_chs)
        self.gamma = nn.Parameter(torch.ones(hidden_chs))
        self.fc2 = nn.Linear(hidden_chs, in_chs)
        self.residual = residual

    @override
    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = self.fc1(x)  # NOTE: no activation here, as in the released weights
        dw = self.gamma * self.dwconv(x, h, w)
        x = x + dw if self.residual else dw
        return self.fc2(x)


class ChannelProcessing(nn.Module):
    """Attentional channel processing.

    Channel gates from token-softmaxed queries and a mean-pooled key prototype, applied to an
    MLP-transformed value.

    Per head (d channels): Q = softmax_tokens(q(x)), k = mean_channels(softmax_tokens(x)),
    gate = sigmoid(Q^T k) * temperature, out[n, c] = gate[c] * norm_v(mlp_v(x))[n, c].

    Args:
        dim: Channels.
        num_heads: Heads the channels are split into.
        mlp_ratio: Hidden width of ``mlp_v`` relative to ``dim``.
        dw_residual: See :class:`MlpDWBN`.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.,
                 dw_residual: bool = True) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        self.num_heads = num_heads
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.q = nn.Linear(dim, dim)
        self.mlp_v = MlpDWBN(dim, int(dim * mlp_ratio), residual=dw_residual)
        self.norm_v = nn.LayerNorm(dim, eps=1e-5)

    def channel_gates(self, x: torch.Tensor) -> torch.Tensor:
        """The gates a of every head, shape (B, heads, d, 1)."""
        b, n, c = x.shape
        q = self.q(x).reshape(b, n, self.num_heads, -1).permute(0, 2, 1, 3)
        k = x.reshape(b, n, self.num_heads, -1).permute(0, 2, 1, 3)
        k_proto = k.softmax(dim=-2).mean(dim=-1, keepdim=True)  # (B, h, N, 1)
        gate = torch.sigmoid(q.softmax(dim=-2).transpose(-1, -2) @ k_proto)
        return gate * self.temperature

    @override
    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, c = x.shape
        v = self.norm_v(self.mlp_v(x, h, w)).reshape(b, n, self.num_heads, -1)
        gate = self.channel_gates(x)  # (B, heads, d, 1)
        return (v * gate.permute(0, 3, 1, 2)).reshape(b, n, c)
