"""RM's protocol: the old classifier's confidence on the stored old vector, lowest first."""

from __future__ import annotations

from modelupgrade.store.policies.base import STORE_POLICIES, ScoreOrder


@STORE_POLICIES.register("old-confidence")
class OldConfidenceOrder(ScoreOrder):
    direction = "ascending"
    score_meaning = "the old classifier's confidence"
