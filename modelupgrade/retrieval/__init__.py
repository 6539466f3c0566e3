"""The retrieval kernel: how vectors are compared, ranked and searched, for every
part of the project.

``distance``: the similarities of evaluation and the distances of backfilling and the store,
computed by one function. ``topk``: the ranking rule of a gallery split between an old and a new
part (ties to the new side, then the lower index) and exact top-k under it. ``index``: FAISS indexes
(exact flat, IVF, HNSW) for large galleries.
"""

from modelupgrade.retrieval.distance import (
    DISTANCES,
    SIMILARITIES,
    Distance,
    DistanceBlock,
    Similarity,
    as_feature_tensor,
    check_distance,
    l2_normalise,
    prepare,
    reported_distance,
    score_block,
)
from modelupgrade.retrieval.topk import RankedPart, TopK, merged_topk, orderable, ranking_keys

__all__ = [
    "DISTANCES",
    "SIMILARITIES",
    "Distance",
    "DistanceBlock",
    "RankedPart",
    "Similarity",
    "TopK",
    "as_feature_tensor",
    "check_distance",
    "l2_normalise",
    "merged_topk",
    "orderable",
    "prepare",
    "ranking_keys",
    "reported_distance",
    "score_block",
]
