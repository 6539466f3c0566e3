"""FastFill: highest predicted σ² first (σ² is computed from the stored old vector only)."""

from __future__ import annotations

from modelupgrade.ordering.base import ORDERINGS, OrderingPolicy


@ORDERINGS.register("fastfill-uncertainty")
class HighestUncertaintyFirst(OrderingPolicy):
    description = "needs σ² from a FastFill head applied to the stored old gallery vectors"
    score = "fastfill-sigma2"
