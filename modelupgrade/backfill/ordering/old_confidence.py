"""Seo et al.'s main protocol: lowest old-classifier confidence (max softmax probability) first."""

from __future__ import annotations

import numpy as np

from modelupgrade.backfill.ordering.base import ORDERINGS, OrderingContext, OrderingPolicy, rows_of


@ORDERINGS.register("old-confidence")
class LowestOldConfidenceFirst(OrderingPolicy):
    description = "needs the old classifier's logits or probabilities on the stored old vectors"
    descending = False

    def available(self, context: OrderingContext) -> bool:
        return context.old_logits is not None or context.old_probabilities is not None

    def scores(self, context: OrderingContext) -> np.ndarray:
        return rows_of(context.probabilities(), context.n, "old probabilities").max(axis=1)
