"""Items in the order they were ingested (slot order): needs no score at all."""

from __future__ import annotations

import numpy as np

from modelupgrade.store.policies.base import STORE_POLICIES, OrderingPolicy


@STORE_POLICIES.register("ingest-order")
class IngestOrder(OrderingPolicy):
    def order(self, slots: np.ndarray, scores: np.ndarray) -> np.ndarray:
        return np.sort(slots)
