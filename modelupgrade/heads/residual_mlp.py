"""Residual MLP adapter (Drift-Adapter's third parameterisation): z + MLP(z) with z = L(x), L the
orthogonal Procrustes map between the two spaces (``base: procrustes``, fitted in closed form and
then kept fixed) or the identity (``base: identity``, Drift-Adapter's x + MLP(x); equal dimensions
only). The MLP's last layer starts at zero, so the adapter starts exactly at its base map and a few
epochs of ``loss`` (cosine or mean squared error) on the pairs learn the non-linear remainder.

This kind is fitted, not closed form, but it stays cheap: a width-128, depth-2 MLP trained for 20
epochs of batches of 256 pairs (seconds on a CPU core for a few thousand pairs).

``residual_mlp`` maps the stored old vectors into the new space (gallery side);
``residual_mlp_query`` maps new-model queries into the old space (query side).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from modelupgrade.config.base import Section
from modelupgrade.config.heads import HeadTraining
from modelupgrade.errors import UserError
from modelupgrade.heads.alignment import LinearMap, orthogonal_procrustes
from modelupgrade.heads.base import Head, HeadBatch
from modelupgrade.heads.losses import paired_distance, squared_error
from modelupgrade.layers import MLP, Transform


class ResidualMLPOptions(Section):
    base: Literal["procrustes", "identity"] = "procrustes"
    loss: Literal["cosine", "mse"] = "cosine"


class ResidualMap(Transform):
    """z + MLP(z), z = base(x)."""

    base: LinearMap
    residual: MLP

    def __init__(self, base: LinearMap, residual: MLP) -> None:
        super().__init__()
        self.base, self.residual = base, residual
        last = residual.net[-1]
        assert isinstance(last, nn.Linear)  # an MLP ends in a linear layer
        with torch.no_grad():
            last.weight.zero_()
            last.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.base(x)
        return z + self.residual(z)

    def macs_per_row(self) -> int:
        return self.base.macs_per_row() + self.residual.macs_per_row()


class ResidualMLPAdapter(
    Head[ResidualMLPOptions], kind="residual_mlp", direction="forward", training_free=True
):
    psi: ResidualMap
    TRAINING_DEFAULTS = HeadTraining.adam(
        hidden_dim=128, depth=2, epochs=20, batch_size=256, lr=1e-3
    )

    def build_transform(self) -> ResidualMap:
        if self.options.base == "identity" and self.in_dim != self.out_dim:
            raise UserError(
                f"a residual MLP on the identity maps equal dimensions, not {self.in_dim}-d to "
                f"{self.out_dim}-d",
                hint="set options.base: procrustes (a semi-orthogonal map first)",
            )
        return ResidualMap(
            LinearMap(self.in_dim, self.out_dim),
            MLP(self.out_dim, self.out_dim, self.hidden_dim, self.depth),
        )

    def fit_closed_form(self, source: torch.Tensor, target: torch.Tensor) -> None:
        if self.options.base == "procrustes":
            self.psi.base.set(orthogonal_procrustes(source, target))

    def loss(self, batch: HeadBatch) -> torch.Tensor:
        transformed, target = self(self.source(batch)), self.target(batch)
        if self.options.loss == "cosine":
            return paired_distance(transformed, target, "cosine").mean()
        return squared_error(transformed, target, "mean").mean()


class ResidualMLPQueryAdapter(ResidualMLPAdapter, kind="residual_mlp_query", direction="reverse"):
    pass
