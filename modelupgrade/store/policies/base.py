"""The interface of a store ordering policy and the registry that names them."""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.registry_util import Registry

STORE_POLICIES: Registry[OrderingPolicy] = Registry("backfill ordering policy")


class OrderingPolicy:
    """Turns the items to backfill into a full order (a permutation of their slots)."""

    registry_name: ClassVar[str]

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def order(self, slots: np.ndarray, scores: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class ScoreOrder(OrderingPolicy):
    """Orders by the stored per-item score; ties keep slot order so the plan is reproducible."""

    direction: ClassVar[Literal["ascending", "descending"]]
    score_meaning: ClassVar[str]

    def order(self, slots: np.ndarray, scores: np.ndarray) -> np.ndarray:
        missing = int(np.isnan(scores).sum())
        if missing:
            raise UserError(
                f"policy {self.registry_name!r} orders by {self.score_meaning}, but {missing} item(s) of "
                "the store have no ordering score",
                hint="ingest the gallery with scores (--scores), or use the 'random' or 'ingest-order' policy",
            )
        key = scores if self.direction == "ascending" else -scores
        return slots[np.lexsort((slots, key))]


def build_policy(name: str, seed: int = 0) -> OrderingPolicy:
    return STORE_POLICIES.get(name)(seed=seed)
