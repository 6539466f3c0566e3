"""FastFill's order: the predicted σ² of the transformed old vector, highest first."""

from __future__ import annotations

from modelupgrade.store.policies.base import STORE_POLICIES, ScoreOrder


@STORE_POLICIES.register("fastfill-uncertainty")
class FastFillUncertaintyOrder(ScoreOrder):
    direction = "descending"
    score_meaning = "FastFill's predicted uncertainty σ²"
