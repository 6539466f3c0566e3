"""Generalised-mean pooling (Radenović et al.), the landmark-retrieval default (p = 3)."""

from __future__ import annotations

import torch
from torch import nn


class GeM(nn.Module):
    """GeM(X) = (mean_hw max(X, eps)^p)^(1/p) over the spatial dimensions of an NCHW map."""

    def __init__(self, p: float = 3.0, eps: float = 1e-6, learnable: bool = False) -> None:
        super().__init__()
        p_tensor = torch.tensor(float(p))
        if learnable:
            self.p = nn.Parameter(p_tensor)
        else:
            self.register_buffer("p", p_tensor)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 3:  # token sequences (ViT/Swin with global_pool=""): pool over tokens
            x = x.transpose(1, 2).unsqueeze(-1)
        # Pool in float32: x^p overflows bf16/half for p = 3 on large activations.
        pooled = x.float().clamp(min=self.eps).pow(self.p).mean(dim=(-2, -1)).pow(1.0 / self.p)
        return pooled.to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"p={float(self.p):.2f}, eps={self.eps}, learnable={isinstance(self.p, nn.Parameter)}"
        )
