"""The feature-to-feature MLP used by every transformation head:
[Linear → BN → ReLU] × (depth−1) → Linear.

DMU's forward-adaptive head is depth 4, hidden 1024; BiCT's feature upgrade module
depth 4, hidden 4096.
"""

from __future__ import annotations

import torch
from torch import nn


class Transform(nn.Module):
    """A map of embeddings to embeddings, (N, in) → (N, out), whose cost per row is known: what a
    transformation head's ``psi`` is."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def macs_per_row(self) -> int:
        """Multiply-accumulates to transform one embedding."""
        raise NotImplementedError


class MLP(Transform):
    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        hidden_dim: int = 1024,
        depth: int = 4,
        batch_norm: bool = True,
    ) -> None:
        super().__init__()
        if depth < 1:
            raise ValueError(f"MLP depth must be ≥ 1, got {depth}")
        layers: list[nn.Module] = []
        width = in_dim
        for _ in range(depth - 1):
            layers.append(nn.Linear(width, hidden_dim, bias=not batch_norm))
            if batch_norm:
                layers.append(nn.BatchNorm1d(hidden_dim))
            layers.append(nn.ReLU(inplace=True))
            width = hidden_dim
        layers.append(nn.Linear(width, out_dim))
        self.net = nn.Sequential(*layers)
        self.in_dim, self.out_dim, self.hidden_dim, self.depth = in_dim, out_dim, hidden_dim, depth

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def macs_per_row(self) -> int:
        """Multiply-accumulates to transform one embedding (linear layers
        dominate; BN folds away)."""
        return sum(m.in_features * m.out_features for m in self.net if isinstance(m, nn.Linear))
