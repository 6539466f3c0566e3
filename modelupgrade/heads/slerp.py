"""SLERP backward compatibility (Ricci, Biondi, Pernici, NeurIPS 2026): the new model's query,
aligned into the old space by orthogonal Procrustes, blended along the unit sphere with the old
model's embedding of the same query,

    q = slerp(â, ô, α),  â = L(φ_new(q)) / ‖·‖,  ô = φ_old(q) / ‖·‖,
    slerp(a, b, α) = sin((1 − α)·ω)/sin ω · a + sin(α·ω)/sin ω · b,  cos ω = a·b,

and searched against the old gallery as stored. α = 0 is the aligned query alone (Procrustes),
α = 1 the old query alone (no upgrade). L is fitted in closed form as ``procrustes_query`` is
(semi-orthogonal when the dimensions differ; the paper zero-pads, which gives the same map).

α is chosen as the paper chooses it, on a support set: with ``weight`` left unset, a seeded
``support_fraction`` of the fitting pairs is held out, L is fitted on the rest, and α is the value
of a grid over [0, 1] whose blended queries retrieve best (mAP by label, each query's own item left
out) among the support items' old vectors — the old index as it is stored. A set ``weight`` fixes
α instead (and L is fitted on every pair). The chosen α is kept with the weights.

Query side only, and only where **both models embed the query**: the blend reads φ_old(q), so the
old model must keep running beside the new one during the transition (two forward passes per
query), as the paper says. The head takes φ_old(q) as its side input (``takes_old_embedding``); the
study's evaluation gives it the old model's query embeddings. A serving path that has only the new
model's query (the store's rank-merge-rqt mode) cannot run it and refuses it for the missing side
input; there, ``procrustes_query`` (α = 0) is the adapter to serve. For an embeddings-only old model
(no model left to run) SLERP does not apply.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from modelupgrade.config.base import Section
from modelupgrade.errors import UserError
from modelupgrade.heads.alignment import ClosedFormAdapter, LinearMap, orthogonal_procrustes
from modelupgrade.heads.base import HeadBatch
from modelupgrade.heads.losses import squared_error


def support_map(scores: np.ndarray, labels: np.ndarray) -> float:
    """mAP of the support queries against the support items' old vectors, each query's own item
    left out (it is in the gallery: the same image)."""
    from modelupgrade.metrics.ranking import mean_average_precision

    return mean_average_precision(scores, labels, labels, leave_one_out=True)


# Below this sin ω the two endpoints are (anti)parallel and the normalised linear blend is used.
PARALLEL = 1e-6


def slerp(a: torch.Tensor, b: torch.Tensor, weight: float) -> torch.Tensor:
    """Row-wise spherical interpolation from unit vectors ``a`` (weight 0) to ``b`` (weight 1)."""
    cos = (a * b).sum(dim=1, keepdim=True).clamp(-1.0, 1.0)
    omega = torch.arccos(cos)
    sin = torch.sin(omega)
    safe = sin.clamp_min(PARALLEL)
    blended = (torch.sin((1.0 - weight) * omega) * a + torch.sin(weight * omega) * b) / safe
    linear = F.normalize((1.0 - weight) * a + weight * b, dim=1)
    return torch.where(sin > PARALLEL, blended, linear)


class SlerpOptions(Section):
    # α: 0 = the aligned new query, 1 = the old query; None: chosen on a support split.
    weight: float | None = Field(default=None, ge=0, le=1)
    support_fraction: float = Field(default=0.2, gt=0, lt=1)
    # The α grid searched on the support split: 0, step, 2·step, …, 1.
    grid_step: float = Field(default=0.05, gt=0, le=0.5)


class SlerpQueryAdapter(
    ClosedFormAdapter[SlerpOptions],
    kind="slerp_query",
    direction="reverse",
    takes_old_embedding=True,
):
    psi: LinearMap

    alpha: torch.Tensor  # a buffer: the α the support split chose

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A buffer, so that the weights file keeps the α the support split chose.
        weight = self.options.weight
        self.register_buffer("alpha", torch.tensor(0.5 if weight is None else weight))

    def build_transform(self) -> LinearMap:
        return LinearMap(self.in_dim, self.out_dim)

    def fit_closed_form(self, source: torch.Tensor, target: torch.Tensor) -> None:
        self.psi.set(orthogonal_procrustes(source, target))

    def calibrate(self, batch: HeadBatch) -> None:
        """Choose α on a held-out support split of the fitting pairs (the paper's protocol), L
        refitted on the rest; with a fixed ``weight`` nothing is chosen."""
        if self.options.weight is not None:
            return
        old_query = batch.old if batch.side_info is None else batch.side_info
        n = len(batch.labels)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(n))
        support = order[: max(2, round(self.options.support_fraction * n))]
        fitting = order[len(support) :]
        self.fit_closed_form(batch.new[fitting], batch.old[fitting])
        aligned = F.normalize(self.psi(batch.new[support]), dim=1)
        old = F.normalize(old_query[support].to(aligned.dtype), dim=1)
        gallery = F.normalize(batch.old[support].to(aligned.dtype), dim=1)
        labels = batch.labels[support].cpu().numpy()
        steps = round(1 / self.options.grid_step)
        scored = []
        for alpha in (i / steps for i in range(steps + 1)):
            queries = slerp(aligned, old, alpha)
            scores = (queries @ gallery.T).cpu().numpy()
            scored.append((support_map(scores, labels), -alpha))
        self.alpha.fill_(-max(scored)[1])

    def loss(self, batch: HeadBatch) -> torch.Tensor:
        # A training image's old embedding is the old model's "query" of that image.
        old = batch.old if batch.side_info is None else batch.side_info
        return squared_error(self(batch.new, old), batch.old, "mean").mean()

    def outputs(
        self, x: torch.Tensor, side_info: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        if side_info is None:
            raise UserError(
                "the SLERP query adapter blends with the old model's embedding of the query, "
                "which was not given",
                hint="embed the query with the old model too, or serve procrustes_query instead",
            )
        aligned = F.normalize(self.psi(x), dim=1)
        old = F.normalize(side_info.to(aligned.dtype), dim=1)
        return {"transform": slerp(aligned, old, float(self.alpha))}
