"""Backfill ordering policies (registry ``ORDERINGS``), one class per file."""

from modelupgrade.backfill.ordering import (  # noqa: F401  (registration)
    fastfill_uncertainty,
    old_confidence,
    old_entropy,
    oracle,
    random_order,
)
from modelupgrade.backfill.ordering.base import ORDERINGS, OrderingContext, OrderingPolicy, build_ordering

__all__ = ["ORDERINGS", "OrderingContext", "OrderingPolicy", "build_ordering"]
