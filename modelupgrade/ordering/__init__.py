"""Backfill ordering policies (registry ``ORDERINGS``), one class per file, shared by the simulator
(``modelupgrade.backfill``) and the real store (``modelupgrade.store``)."""

from modelupgrade.ordering import (  # noqa: F401  (registration)
    fastfill_uncertainty,
    ingest_order,
    old_confidence,
    old_entropy,
    oracle,
    random_order,
)
from modelupgrade.ordering.base import ORDERINGS, OrderingPolicy, build_ordering
from modelupgrade.ordering.scores import (
    SCORE_KINDS,
    OrderingInputs,
    ScoreKind,
    score_kind_of,
    softmax,
)

__all__ = [
    "ORDERINGS",
    "SCORE_KINDS",
    "OrderingInputs",
    "OrderingPolicy",
    "ScoreKind",
    "build_ordering",
    "score_kind_of",
    "softmax",
]
