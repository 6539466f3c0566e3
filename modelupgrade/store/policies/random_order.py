"""Uniformly random order (the FCT/BCT baselines' protocol); reproducible from the seed."""

from __future__ import annotations

import numpy as np

from modelupgrade.store.policies.base import STORE_POLICIES, OrderingPolicy


@STORE_POLICIES.register("random")
class RandomOrder(OrderingPolicy):
    def order(self, slots: np.ndarray, scores: np.ndarray) -> np.ndarray:
        return np.random.default_rng(self.seed).permutation(np.sort(slots))
