"""Uniformly random order (the FCT/BCT baselines' protocol), reproducible from the seed alone."""

from __future__ import annotations

import numpy as np

from modelupgrade.ordering.base import ORDERINGS, OrderingPolicy


@ORDERINGS.register("random")
class RandomOrder(OrderingPolicy):
    description = "a seeded random permutation; needs nothing"
    draws_from_seed = True

    def draw(self, n: int, seed: int) -> np.ndarray:
        return np.argsort(-np.random.default_rng(seed).random(n), kind="stable")
