"""The eleven claims in the report's order, and the one call that checks them all."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from modelupgrade.report.claims.adapters import (
    drift_adapter_recovers_reindexing,
    slerp_is_backward_compatible,
)
from modelupgrade.report.claims.backfill import (
    fastfill_beats_fct,
    fastfill_loss_beats_fct,
    full_method_beats_naive_rank_merge,
    rank_merge_is_monotone,
    uncertainty_order_beats_random,
)
from modelupgrade.report.claims.checks import (
    Claim,
)
from modelupgrade.report.claims.compatibility import (
    bct_is_backward_compatible,
    bct_loses_new_to_new_accuracy,
    dmu_beats_bct_on_both_sides,
    forward_adapters_raise_new_to_old,
)
from modelupgrade.report.results import StudyResults

CLAIMS: tuple[Callable[[Sequence[StudyResults]], Claim], ...] = (
    bct_is_backward_compatible,
    bct_loses_new_to_new_accuracy,
    dmu_beats_bct_on_both_sides,
    forward_adapters_raise_new_to_old,
    full_method_beats_naive_rank_merge,
    rank_merge_is_monotone,
    uncertainty_order_beats_random,
    fastfill_beats_fct,
    fastfill_loss_beats_fct,
    drift_adapter_recovers_reindexing,
    slerp_is_backward_compatible,
)


def check_claims(study: StudyResults, replicates: Sequence[StudyResults] = ()) -> list[Claim]:
    """Each of the papers' claims, checked on the scenarios of its scope, on the study's own seed
    and on each replicate's (``modelupgrade.replicates``)."""
    return [claim([study, *replicates]) for claim in CLAIMS]
