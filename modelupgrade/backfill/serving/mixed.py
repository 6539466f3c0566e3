"""(a) One mixed index: the new query against φ_new(g) where backfilled, else ψ(φ_old(g)) (or φ_old(g)).

BCT-style compatible models serve the raw old vectors; forward adapters (FCT, BiCT, DMU, FastFill)
serve ψ(φ_old(g)), computed once from the stored vectors.
"""

from __future__ import annotations

from modelupgrade.backfill.engine import SearchSystems
from modelupgrade.backfill.serving.base import SERVING_MODES, ServingArrays, ServingMode


@SERVING_MODES.register("mixed")
class MixedIndex(ServingMode):
    description = "needs new query and gallery vectors, and the old gallery vectors or ψ(old)"
    requires = (("new_query", "new_gallery", "forward_gallery"), ("new_query", "new_gallery", "old_gallery"))

    def _systems(self, arrays: ServingArrays) -> SearchSystems:
        old_state = arrays.forward_gallery if arrays.forward_gallery is not None else arrays.old_gallery
        return SearchSystems(arrays.new_query, old_state, arrays.new_query, arrays.new_gallery)
