"""FastFill: highest predicted σ² first (σ² is computed from the stored old vector only)."""

from __future__ import annotations

import numpy as np

from modelupgrade.backfill.ordering.base import ORDERINGS, OrderingContext, OrderingPolicy, rows_of


@ORDERINGS.register("fastfill-uncertainty")
class HighestUncertaintyFirst(OrderingPolicy):
    description = "needs σ² from a FastFill head applied to the stored old gallery vectors"

    def available(self, context: OrderingContext) -> bool:
        return context.sigma2 is not None

    def scores(self, context: OrderingContext) -> np.ndarray:
        return rows_of(context.sigma2, context.n, "σ²").reshape(-1)
