"""Orthogonal Procrustes adapter (Drift-Adapter's first parameterisation; the SLERP paper's
alignment step): the orthogonal map between the two spaces that best matches the pairs, in closed
form (``alignment.orthogonal_procrustes``). It keeps every distance and angle of the space it maps,
so it cannot collapse the way an unconstrained affine map can when the dimensions differ.

Different dimensions: a semi-orthogonal map (the thin SVD's U·Vᵀ), which is what zero-padding the
smaller side and solving the square problem gives. ``center`` subtracts each side's mean first and
adds the target's mean back (an affine alignment); off by default, as in Drift-Adapter and the
SLERP code: cosine retrieval needs no translation.

``procrustes`` maps the stored old vectors into the new space (gallery side, a vector-only
backfill); ``procrustes_query`` maps new-model queries into the old space (query side, nothing
backfilled).
"""

from __future__ import annotations

import torch

from modelupgrade.config.base import Section
from modelupgrade.heads.alignment import ClosedFormAdapter, LinearMap, orthogonal_procrustes


class ProcrustesOptions(Section):
    center: bool = False


class ProcrustesAdapter(
    ClosedFormAdapter[ProcrustesOptions], kind="procrustes", direction="forward"
):
    psi: LinearMap

    def build_transform(self) -> LinearMap:
        return LinearMap(self.in_dim, self.out_dim, bias=self.options.center)

    def fit_closed_form(self, source: torch.Tensor, target: torch.Tensor) -> None:
        if not self.options.center:
            self.psi.set(orthogonal_procrustes(source, target))
            return
        source_mean, target_mean = source.double().mean(0), target.double().mean(0)
        weight = orthogonal_procrustes(source - source_mean, target - target_mean)
        self.psi.set(weight, target_mean - source_mean @ weight)


class ProcrustesQueryAdapter(ProcrustesAdapter, kind="procrustes_query", direction="reverse"):
    pass
