"""(d) Seo et al.'s full method (§4.3): the backfilled part stores ρ(φ_new(g)) and is searched with
ρ(φ_new(q)); the old part φ_old(g) is searched with ψ_rev(ρ(φ_new(q))); merged by raw distance."""

from __future__ import annotations

from modelupgrade.backfill.engine import SearchSystems
from modelupgrade.backfill.serving.base import SERVING_MODES, ServingArrays, ServingMode


@SERVING_MODES.register("rank-merge-full")
class FullMethodRankMerge(ServingMode):
    description = "needs ρ(φ_new(q)), ρ(φ_new(g)) and ψ_rev(ρ(φ_new(q))) from an rm_full head, and φ_old(g)"
    requires = (("rho_reverse_query", "rho_query", "old_gallery", "rho_gallery"),)

    def _systems(self, arrays: ServingArrays) -> SearchSystems:
        return SearchSystems(arrays.rho_reverse_query, arrays.old_gallery, arrays.rho_query, arrays.rho_gallery)
