"""RACT's order (a FastFill baseline): highest entropy of the old classifier's prediction first."""

from __future__ import annotations

from modelupgrade.ordering.base import ORDERINGS, OrderingPolicy


@ORDERINGS.register("old-entropy")
class HighestOldEntropyFirst(OrderingPolicy):
    description = "needs the old classifier's logits (or probabilities) on the stored old vectors"
    score = "old-entropy"
