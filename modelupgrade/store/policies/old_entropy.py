"""RACT's order: entropy of the old classifier's prediction, highest first."""

from __future__ import annotations

from modelupgrade.store.policies.base import STORE_POLICIES, ScoreOrder


@STORE_POLICIES.register("old-entropy")
class OldEntropyOrder(ScoreOrder):
    direction = "descending"
    score_meaning = "the entropy of the old classifier's prediction"
