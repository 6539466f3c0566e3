"""Seo et al.'s full method (§4.3): a learnable new embedding ρ trained jointly
with ψ_rev under MCL.

ρ sits on the frozen new model; ρ∘φ_new becomes the final new embedding, so the backfilled gallery
stores ρ(φ_new(g)) (output ``new_embedding``) and queries use ρ(φ_new(q)) against it and
ψ_rev(ρ(φ_new(q))) (output ``transform``) against the old part of the gallery.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from modelupgrade.heads.base import Head, HeadBatch
from modelupgrade.heads.mcl import MCLOptions, mcl_loss
from modelupgrade.heads.rqt import REVERSE_DEFAULTS
from modelupgrade.layers import MLP


class RMFullOptions(MCLOptions):
    # ρ's width and depth; null = the same as ψ_rev's.
    rho_hidden_dim: int | None = Field(default=None, ge=1)
    rho_depth: int | None = Field(default=None, ge=1)

    def loss_kwargs(self) -> dict[str, object]:
        return self.model_dump(
            exclude={"distance", "samples_per_class", "rho_hidden_dim", "rho_depth"}
        )


class RankMergeFullMethod(
    Head[RMFullOptions],
    kind="rm_full",
    direction="reverse",
    class_balanced_batches=True,
    output_names=("transform", "new_embedding"),
    aligns=False,
):
    TRAINING_DEFAULTS = REVERSE_DEFAULTS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rho = MLP(
            self.in_dim,
            self.in_dim,
            self.options.rho_hidden_dim or self.hidden_dim,
            self.options.rho_depth or self.depth,
        )

    def outputs(
        self, x: torch.Tensor, side_info: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        new_embedding = self.rho(x)
        return {"transform": self.psi(new_embedding), "new_embedding": new_embedding}

    def macs_per_embedding(self) -> dict[str, int]:
        rho = self.rho.macs_per_row()
        return {"transform": rho + self.psi.macs_per_row(), "new_embedding": rho}

    def loss(self, batch: HeadBatch) -> torch.Tensor:
        out = self.outputs(batch.new)
        return mcl_loss(out["transform"], out["new_embedding"], batch, self.options)
