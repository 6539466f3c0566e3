"""Backfill ordering policies of the real store: which items get the new model first.

Each policy is one file registered in ``STORE_POLICIES``. Score-based policies read the ordering
score stored with each item at ingest (old-classifier confidence, entropy, FastFill σ²); the store
never needs the new model to decide the order.
"""

from modelupgrade.store.policies.base import STORE_POLICIES, OrderingPolicy, ScoreOrder, build_policy
from modelupgrade.store.policies.fastfill_uncertainty import FastFillUncertaintyOrder
from modelupgrade.store.policies.ingest_order import IngestOrder
from modelupgrade.store.policies.old_confidence import OldConfidenceOrder
from modelupgrade.store.policies.old_entropy import OldEntropyOrder
from modelupgrade.store.policies.random_order import RandomOrder

__all__ = [
    "STORE_POLICIES",
    "FastFillUncertaintyOrder",
    "IngestOrder",
    "OldConfidenceOrder",
    "OldEntropyOrder",
    "OrderingPolicy",
    "RandomOrder",
    "ScoreOrder",
    "build_policy",
]
