"""RACT's order (FastFill baseline): highest entropy of the old classifier's prediction first."""

from __future__ import annotations

import numpy as np

from modelupgrade.backfill.ordering.base import ORDERINGS, OrderingContext, OrderingPolicy, rows_of


@ORDERINGS.register("old-entropy")
class HighestOldEntropyFirst(OrderingPolicy):
    description = "needs the old classifier's logits or probabilities on the stored old vectors"

    def available(self, context: OrderingContext) -> bool:
        return context.old_logits is not None or context.old_probabilities is not None

    def scores(self, context: OrderingContext) -> np.ndarray:
        p = rows_of(context.probabilities(), context.n, "old probabilities")
        return -(p * np.log(np.clip(p, 1e-300, None))).sum(axis=1)
