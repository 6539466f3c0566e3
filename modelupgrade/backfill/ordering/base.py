"""Backfill ordering policies: which gallery items get their new embedding first.

A policy turns what is known before the backfill (stored old vectors, old-classifier outputs, a
head's σ²) into a permutation of the gallery, first backfilled first. Ties keep gallery order, so
an order is reproducible. ``deployable = False`` marks an upper bound that needs every new embedding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.registry_util import Registry


@dataclass(frozen=True)
class OrderingContext:
    """What a policy may read. Fields a deployment would not have before backfilling are marked."""

    n: int
    seed: int = 0
    old_logits: np.ndarray | None = None          # (n, C) old classifier logits on φ_old(g)
    old_probabilities: np.ndarray | None = None   # (n, C) or its softmax, if logits are absent
    sigma2: np.ndarray | None = None              # (n,) FastFill σ² of each stored old vector
    old_state_vectors: np.ndarray | None = None   # (n, d) what an un-backfilled item serves: ψ(φ_old) or φ_old
    new_vectors: np.ndarray | None = None         # (n, d) φ_new(g): known only after backfilling (oracle)

    def probabilities(self) -> np.ndarray | None:
        if self.old_probabilities is not None:
            return np.asarray(self.old_probabilities, dtype=np.float64)
        if self.old_logits is None:
            return None
        logits = np.asarray(self.old_logits, dtype=np.float64)
        logits = logits - logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        return exp / exp.sum(axis=1, keepdims=True)


class OrderingPolicy:
    deployable: ClassVar[bool] = True
    description: ClassVar[str] = ""
    registry_name: ClassVar[str]

    def available(self, context: OrderingContext) -> bool:
        """Whether the context holds what this policy reads."""
        raise NotImplementedError

    def scores(self, context: OrderingContext) -> np.ndarray:
        """One score per item; items are backfilled in the order ``order`` derives from it."""
        raise NotImplementedError

    descending: ClassVar[bool] = True

    def order(self, context: OrderingContext) -> np.ndarray:
        if not self.available(context):
            raise UserError(
                f"ordering policy {self.registry_name!r} needs inputs this simulation lacks",
                hint=self.description,
            )
        scores = np.asarray(self.scores(context), dtype=np.float64)
        if scores.shape != (context.n,) or not np.isfinite(scores).all():
            raise UserError(f"ordering policy {self.registry_name!r} got {scores.shape} scores with NaN/inf "
                            f"or a wrong length for {context.n} items", hint=self.description)
        return np.argsort(-scores if self.descending else scores, kind="stable")


ORDERINGS: Registry[OrderingPolicy] = Registry("backfill ordering policy")


def build_ordering(name: str) -> OrderingPolicy:
    return ORDERINGS.get(name)()


def rows_of(array: np.ndarray | None, n: int, what: str) -> np.ndarray:
    if array is None:
        raise UserError(f"{what} is missing")
    array = np.asarray(array)
    if len(array) != n:
        raise UserError(f"{what} has {len(array)} rows for {n} gallery items")
    return array
