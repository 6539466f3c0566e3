"""Retrieval and upgrade metrics, each named after the protocol (and reference) it reproduces.

Plain numpy/torch, no project state: outside harnesses may import these names directly.
``tests/test_metrics_oracles.py`` checks them against the reference implementations' outputs in
``shared/oracles``.
"""

from modelupgrade.metrics.backfill import backfill_curve_reference, backfill_cutoffs, mixed_gallery
from modelupgrade.metrics.benchmarks import (
    REVISITOP_PROTOCOLS,
    TarAtFarAccumulator,
    gldv2_inputs_from_padded,
    gldv2_map_at_k,
    revisitop_average_precision,
    revisitop_ground_truth,
    revisitop_map,
    roc_curve,
    tar_at_far,
)
from modelupgrade.metrics.compatibility import (
    average_compatibility,
    average_multimodel_accuracy,
    backward_compatibility,
    compatibility_summary,
    degradation,
    forward_compatibility,
    negative_flip_rate,
    negative_flips,
    upgrade_gain,
)
from modelupgrade.metrics.ranking import (
    NO_POSITIVE_RULES,
    PerQueryRanking,
    cmc_from_ranking,
    cmc_topk,
    leave_one_out_cmc,
    leave_one_out_map,
    map_at_k_from_ranking,
    map_from_ranking,
    mean_average_precision,
    rank_block,
    rank_queries,
    truncated_average_precision,
)
from modelupgrade.metrics.similarity import pairwise_scores, rank_features
from modelupgrade.retrieval.distance import SIMILARITIES, l2_normalise

__all__ = [
    "NO_POSITIVE_RULES",
    "REVISITOP_PROTOCOLS",
    "SIMILARITIES",
    "PerQueryRanking",
    "TarAtFarAccumulator",
    "average_compatibility",
    "average_multimodel_accuracy",
    "backfill_curve_reference",
    "backfill_cutoffs",
    "backward_compatibility",
    "cmc_from_ranking",
    "cmc_topk",
    "compatibility_summary",
    "degradation",
    "forward_compatibility",
    "gldv2_inputs_from_padded",
    "gldv2_map_at_k",
    "l2_normalise",
    "leave_one_out_cmc",
    "leave_one_out_map",
    "map_at_k_from_ranking",
    "map_from_ranking",
    "mean_average_precision",
    "mixed_gallery",
    "negative_flip_rate",
    "negative_flips",
    "pairwise_scores",
    "rank_block",
    "rank_features",
    "rank_queries",
    "revisitop_average_precision",
    "revisitop_ground_truth",
    "revisitop_map",
    "roc_curve",
    "tar_at_far",
    "truncated_average_precision",
    "upgrade_gain",
]
