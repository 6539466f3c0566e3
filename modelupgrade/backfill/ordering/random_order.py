"""Uniformly random order (FCT/BCT baselines), reproducible from the seed."""

from __future__ import annotations

import numpy as np

from modelupgrade.backfill.ordering.base import ORDERINGS, OrderingContext, OrderingPolicy


@ORDERINGS.register("random")
class RandomOrder(OrderingPolicy):
    description = "a seeded random permutation; needs nothing"

    def available(self, context: OrderingContext) -> bool:
        return True

    def scores(self, context: OrderingContext) -> np.ndarray:
        return np.random.default_rng(context.seed).random(context.n)
