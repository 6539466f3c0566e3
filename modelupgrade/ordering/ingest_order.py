"""Items in the order they were ingested (gallery order): needs no score at all."""

from __future__ import annotations

import numpy as np

from modelupgrade.ordering.base import ORDERINGS, OrderingPolicy


@ORDERINGS.register("ingest-order")
class IngestOrder(OrderingPolicy):
    description = "gallery order; needs nothing"

    def draw(self, n: int, seed: int) -> np.ndarray:
        return np.arange(n)
