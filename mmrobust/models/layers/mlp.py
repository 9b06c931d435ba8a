"""Plain MLPs."""
import torch
import torch.nn as nn
from typing_extensions import override


class Mlp(nn.Module):
    """fc1 -> GELU -> fc2 on tokens (B, N, C)."""

    def __init__(self, in_chs: int, hidden_chs: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_chs, hidden_chs)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_chs, in_chs)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ConvMlp(nn.Module):
    """fc1 -> GELU -> fc2 as 1x1 convolutions on NCHW maps (ConvNeXt in FAN-Hybrid)."""

    def __init__(self, in_chs: int, hidden_chs: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(in_chs, hidden_chs, 1)
        self.act = nn.GELU()
        self.fc2 = nn.Conv2d(hidden_chs, in_chs, 1)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))
