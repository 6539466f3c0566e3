"""Serving modes: how a query is answered while the gallery is split between two spaces.

One file per mode, registered in ``SERVING_MODES``: ``mixed`` (one index over new vectors and old or
ψ(old) vectors) and ``rank-merge`` (two searches, ψ_rev(query) against the old part, merged by
distance).
"""

from modelupgrade.store.serving.base import (
    SERVING_MODES,
    GalleryPart,
    SearchHits,
    ServingMode,
    build_serving_mode,
    pairwise_distances,
    top_k,
)
from modelupgrade.store.serving.mixed import MixedIndex
from modelupgrade.store.serving.rank_merge import RankMerge

__all__ = [
    "SERVING_MODES",
    "GalleryPart",
    "MixedIndex",
    "RankMerge",
    "SearchHits",
    "ServingMode",
    "build_serving_mode",
    "pairwise_distances",
    "top_k",
]
