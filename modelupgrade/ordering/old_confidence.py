"""Seo et al.'s main protocol: lowest old-classifier confidence (max softmax probability) first."""

from __future__ import annotations

from modelupgrade.ordering.base import ORDERINGS, OrderingPolicy


@ORDERINGS.register("old-confidence")
class LowestOldConfidenceFirst(OrderingPolicy):
    description = "needs the old classifier's logits (or probabilities) on the stored old vectors"
    score = "old-confidence"
    descending = False
