"""Query drift compensation (QDC; Goswami, Wang, Twardowski, van de Weijer, CoLLAs 2025, arXiv
2506.00037): the new model's query is moved back into the old space by the drift its neighbourhood
underwent, estimated from items embedded by both models,

    q_old ≈ L(q) − Δ(q),   Δ(q) = Σ_i w_i(q) · (L(n_i) − o_i),
    w(q) = softmax_i(−‖L(q) − L(n_i)‖² / (2σ²)),

with (n_i, o_i) the new and old embeddings of the fitting pairs (L2-normalised) and L the map
into the old space: the identity when both spaces have one dimension (the paper's continual
fine-tuning of one encoder), else the orthogonal Procrustes map, whose residual drift is then
compensated (a deviation the paper's setting never needed). The drift estimate is the kernel
average of Semantic Drift Compensation (Yu et al., CVPR 2020), which QDC carries from class
prototypes to queries; the paper's evaluation code is unreleased, so its exact weighting (σ) is
not checked here: σ = 0.3 on unit vectors is SDC's.

Query side only (``qdc_query``, new → old): nothing is backfilled. It keeps up to ``max_anchors``
of the fitting pairs (a seeded sample beyond that) and costs 2 · anchors · old-dim MACs a query
beside L: it grows with the anchors, not with the gallery.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from modelupgrade.config.base import Section
from modelupgrade.errors import UserError
from modelupgrade.heads.alignment import (
    ClosedFormAdapter,
    LinearMap,
    frozen_parameter,
    orthogonal_procrustes,
)
from modelupgrade.layers import Transform


class DriftCompensationOptions(Section):
    # L: identity (equal dimensions; the paper), procrustes, or auto (identity when it can).
    base: Literal["auto", "identity", "procrustes"] = "auto"
    sigma: float = Field(default=0.3, gt=0)
    max_anchors: int = Field(default=4096, ge=2)
    seed: int = 0


class DriftCompensation(Transform):
    """x ↦ L(x̂) − Σ_i w_i δ_i, w = softmax(−‖L(x̂) − a_i‖²/2σ²) over the ``used`` anchors."""

    used: torch.Tensor  # a buffer: how many anchor rows are fitted

    def __init__(self, in_dim: int, out_dim: int, anchors: int, sigma: float) -> None:
        super().__init__()
        self.sigma = sigma
        self.base = LinearMap(in_dim, out_dim)
        self.anchors = frozen_parameter(anchors, out_dim)
        self.drifts = frozen_parameter(anchors, out_dim)
        self.register_buffer("used", torch.tensor(0))

    def set(self, base: torch.Tensor, anchors: torch.Tensor, drifts: torch.Tensor) -> None:
        self.base.set(base)
        count = len(anchors)
        self.anchors[:count].copy_(anchors.to(self.anchors))
        self.drifts[:count].copy_(drifts.to(self.drifts))
        self.used.fill_(count)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        aligned = self.base(F.normalize(x, dim=1))
        count = int(self.used)
        anchors, drifts = self.anchors[:count], self.drifts[:count]
        squared = torch.cdist(aligned, anchors).square()
        weights = torch.softmax(-squared / (2 * self.sigma**2), dim=1)
        return aligned - weights @ drifts

    def macs_per_row(self) -> int:
        anchors, out_dim = self.anchors.shape
        return self.base.macs_per_row() + 2 * anchors * out_dim


class QueryDriftCompensation(
    ClosedFormAdapter[DriftCompensationOptions], kind="qdc_query", direction="reverse"
):
    psi: DriftCompensation

    @property
    def base(self) -> str:
        if self.options.base == "auto":
            return "identity" if self.in_dim == self.out_dim else "procrustes"
        if self.options.base == "identity" and self.in_dim != self.out_dim:
            raise UserError(
                f"query drift compensation on the identity needs equal dimensions, not "
                f"{self.in_dim}-d to {self.out_dim}-d",
                hint="set options.base: procrustes (or auto)",
            )
        return self.options.base

    def build_transform(self) -> DriftCompensation:
        return DriftCompensation(
            self.in_dim, self.out_dim, self.options.max_anchors, self.options.sigma
        )

    def fit_closed_form(self, source: torch.Tensor, target: torch.Tensor) -> None:
        new, old = F.normalize(source.double(), dim=1), F.normalize(target.double(), dim=1)
        if self.base == "identity":
            base = torch.eye(self.in_dim, dtype=new.dtype)
        else:
            base = orthogonal_procrustes(new, old)
        if len(new) > self.options.max_anchors:
            generator = torch.Generator().manual_seed(self.options.seed)
            keep = torch.randperm(len(new), generator=generator)[: self.options.max_anchors]
            new, old = new[keep], old[keep]
        aligned = new @ base
        self.psi.set(base, aligned, aligned - old)
