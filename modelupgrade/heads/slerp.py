"""SLERP backward compatibility (Ricci, Biondi, Pernici, NeurIPS 2026): the new model's query,
aligned into the old space by orthogonal Procrustes, blended along the unit sphere with the old
model's embedding of the same query,

    q = slerp(â, ô, α),  â = L(φ_new(q)) / ‖·‖,  ô = φ_old(q) / ‖·‖,
    slerp(a, b, α) = sin((1 − α)·ω)/sin ω · a + sin(α·ω)/sin ω · b,  cos ω = a·b,

and searched against the old gallery as stored. α = 0 is the aligned query alone (Procrustes),
α = 1 the old query alone (no upgrade). The paper chooses one α on its support set; here ``weight``
sets it. L is fitted in closed form on the pairs as ``procrustes_query`` is (semi-orthogonal when
the dimensions differ; the paper zero-pads, which gives the same map).

Query side only, and only where **both models embed the query**: the blend reads φ_old(q), so the
old model must keep running beside the new one during the transition (two forward passes per
query), as the paper says. The head takes φ_old(q) as its side input (``takes_old_embedding``); the
study's evaluation gives it the old model's query embeddings. A serving path that has only the new
model's query (the store's rank-merge-rqt mode) cannot run it and refuses it for the missing side
input; there, ``procrustes_query`` (α = 0) is the adapter to serve. For an embeddings-only old model
(no model left to run) SLERP does not apply.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from modelupgrade.config.base import Section
from modelupgrade.errors import UserError
from modelupgrade.heads.alignment import ClosedFormAdapter, LinearMap, orthogonal_procrustes
from modelupgrade.heads.base import HEADS, HeadBatch
from modelupgrade.heads.losses import squared_error

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
    # α: 0 = the aligned new query, 1 = the old query.
    weight: float = Field(default=0.5, ge=0, le=1)


@HEADS.register("slerp_query")
class SlerpQueryAdapter(ClosedFormAdapter):
    direction = "reverse"
    Options = SlerpOptions
    options: SlerpOptions
    psi: LinearMap
    takes_old_embedding = True

    def build_transform(self) -> LinearMap:
        return LinearMap(self.in_dim, self.out_dim)

    def fit_closed_form(self, source: torch.Tensor, target: torch.Tensor) -> None:
        self.psi.set(orthogonal_procrustes(source, target))

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
        return {"transform": slerp(aligned, old, self.options.weight)}
