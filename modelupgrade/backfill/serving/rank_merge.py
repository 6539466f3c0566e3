"""(b) Distance rank merge (Seo et al. §3.2): φ_old(q) vs the old part, φ_new(q) vs the new part,
merged by raw distance (two backbone passes per query)."""

from __future__ import annotations

from modelupgrade.backfill.engine import SearchSystems
from modelupgrade.backfill.serving.base import SERVING_MODES, ServingArrays, ServingMode


@SERVING_MODES.register("rank-merge")
class DistanceRankMerge(ServingMode):
    description = "needs old and new vectors of both queries and gallery"
    requires = (("old_query", "new_query", "old_gallery", "new_gallery"),)

    def _systems(self, arrays: ServingArrays) -> SearchSystems:
        return SearchSystems(arrays.old_query, arrays.old_gallery, arrays.new_query, arrays.new_gallery)
