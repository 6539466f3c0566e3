"""(c) Rank merge with the reverse query transform (Seo et al. §4.1): one backbone pass;
ψ_rev(φ_new(q)) searches the old part, φ_new(q) the new part."""

from __future__ import annotations

from modelupgrade.backfill.engine import SearchSystems
from modelupgrade.backfill.serving.base import SERVING_MODES, ServingArrays, ServingMode


@SERVING_MODES.register("rank-merge-rqt")
class ReverseQueryRankMerge(ServingMode):
    description = "needs ψ_rev(φ_new(q)) from an RQT/MCL head, φ_new(q), φ_old(g) and φ_new(g)"
    requires = (("reverse_query", "new_query", "old_gallery", "new_gallery"),)

    def _systems(self, arrays: ServingArrays) -> SearchSystems:
        return SearchSystems(arrays.reverse_query, arrays.old_gallery, arrays.new_query, arrays.new_gallery)
