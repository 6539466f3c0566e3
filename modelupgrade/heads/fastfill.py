"""FastFill (Jaeckle et al.): old → new alignment with a learned per-sample uncertainty σ².

Loss (Eq. 5, one shared σ² for both terms): mean[(L_align + L_disc) / σ² + log σ² / λ], computed in
the stable form exp(−s)·L + s/λ with s = log σ². L_align = ‖h(φ_old) − φ_new‖², the squared norm
summed over the dimensions as Eq. 3 writes it (``alignment_reduction: mean``, the FCT code's
nn.MSELoss, is kept as a named ablation: it weighs the alignment 1/d of Eq. 3's, so the
discriminative term alone shapes ψ and ψ(old) stops aligning with φ_new), L_disc = the frozen new
classifier's own loss on h(φ_old). The uncertainty is a linear layer on the transformed embedding
(App. A.2). σ² is predicted from the stored old vector alone, so it can order the backfill (highest
first) before any image is re-embedded.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import nn

from modelupgrade.config.base import Section
from modelupgrade.errors import UserError
from modelupgrade.heads.base import Head, HeadBatch
from modelupgrade.heads.fct import FCTAdapter
from modelupgrade.heads.losses import Reduction, squared_error


class FastFillOptions(Section):
    # λ of Eq. 5; the form (L / σ² + log σ²) is λ = 1, the Gaussian NLL would give 1/d.
    uncertainty_lambda: float = Field(default=1.0, gt=0)
    # Eq. 3's ‖·‖² ("sum"); "mean" is the ablation that divides it by the dimension.
    alignment_reduction: Reduction = "sum"
    # Ablations of FastFill Table 5: drop one of the two terms.
    use_alignment: bool = True
    use_discriminative: bool = True


class FastFillAdapter(
    Head[FastFillOptions],
    kind="fastfill",
    direction="forward",
    needs_classifier=True,
    output_names=("transform", "log_variance"),
):
    TRAINING_DEFAULTS = FCTAdapter.TRAINING_DEFAULTS  # the FCT recipe, which FastFill re-used

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not (self.options.use_alignment or self.options.use_discriminative):
            raise UserError("FastFill needs at least one of use_alignment / use_discriminative")
        self.uncertainty = nn.Linear(self.out_dim, 1)

    def outputs(
        self, x: torch.Tensor, side_info: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        transformed = self.psi(x)
        return {"transform": transformed, "log_variance": self.uncertainty(transformed).squeeze(1)}

    def macs_per_embedding(self) -> dict[str, int]:
        return {
            "transform": self.psi.macs_per_row(),
            "log_variance": self.psi.macs_per_row() + self.out_dim,
        }

    def per_sample_loss(self, batch: HeadBatch, transformed: torch.Tensor) -> torch.Tensor:
        """L_align + L_disc per sample: what σ² learns to predict (FastFill-Cheating ranks by it)"""
        total = torch.zeros(len(transformed), device=transformed.device)
        if self.options.use_alignment:
            total = total + squared_error(transformed, batch.new, self.options.alignment_reduction)
        if self.options.use_discriminative:
            if batch.classifier is None:
                raise UserError("FastFill's discriminative loss needs the new model's classifier")
            total = total + batch.classifier.loss(transformed, batch.labels, reduction="none")
        return total

    def loss(self, batch: HeadBatch) -> torch.Tensor:
        out = self.outputs(batch.old)
        log_variance = out["log_variance"]
        per_sample = self.per_sample_loss(batch, out["transform"])
        return (
            torch.exp(-log_variance) * per_sample + log_variance / self.options.uncertainty_lambda
        ).mean()
