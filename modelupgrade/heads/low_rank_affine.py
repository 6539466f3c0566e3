"""Low-rank affine adapter (Drift-Adapter's second parameterisation): x ↦ x·A·B + b with A·B of rank
``rank``, the least-squares map under that constraint in closed form (reduced-rank regression,
``alignment.reduced_rank_regression``), with a relative ``ridge`` for small samples. A rank at or
above the smaller dimension gives the full affine least-squares map. Unconstrained affine maps can
collapse when the dimensions differ (Local Drift-Adapters' MiniLM → E5-large row); the rank and the
ridge are the guards.

``affine`` maps the stored old vectors into the new space (gallery side); ``affine_query`` maps
new-model queries into the old space (query side).
"""

from __future__ import annotations

import torch
from pydantic import Field

from modelupgrade.config.base import Section
from modelupgrade.heads.alignment import ClosedFormAdapter, LowRankMap, reduced_rank_regression


class LowRankAffineOptions(Section):
    # Clipped to the smaller of the two dimensions.
    rank: int = Field(default=32, ge=1)
    # λ = ridge · trace(XᵀX) / d of the centred sample; 0 = plain least squares.
    ridge: float = Field(default=1e-3, ge=0)


class LowRankAffineAdapter(
    ClosedFormAdapter[LowRankAffineOptions], kind="affine", direction="forward"
):
    psi: LowRankMap

    @property
    def rank(self) -> int:
        return min(self.options.rank, self.in_dim, self.out_dim)

    def build_transform(self) -> LowRankMap:
        return LowRankMap(self.in_dim, self.out_dim, self.rank)

    def fit_closed_form(self, source: torch.Tensor, target: torch.Tensor) -> None:
        self.psi.set(*reduced_rank_regression(source, target, self.rank, self.options.ridge))


class LowRankAffineQueryAdapter(LowRankAffineAdapter, kind="affine_query", direction="reverse"):
    pass
