"""Backfill ordering policies: which gallery items get their new vector first.

A policy is a score kind (``modelupgrade.ordering.scores``, or none), a direction and the shared
rules: equal scores keep gallery position order, and a seeded policy draws from ``seed`` alone, so
the simulator and the store that run a policy with the same seed on the same items produce the same
order. ``order`` returns positions 0..n-1 (gallery rows, or the store's items sorted by slot), first
backfilled first. ``deployable = False`` marks a reference order that needs every new vector.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.ordering.scores import OrderingInputs, score_kind_of
from modelupgrade.plugins import Registry


class OrderingPolicy:
    registry_name: ClassVar[str]
    description: ClassVar[str] = ""
    # The score kind this policy orders by; None for policies that need no score.
    score: ClassVar[str | None] = None
    # Higher score first.
    descending: ClassVar[bool] = True
    # The serving modes whose backfill this order is meant for; None: every mode.
    serving_modes: ClassVar[tuple[str, ...] | None] = None
    # The order is a draw from the seed: one seed's curve is one sample of the policy's, so a study
    # averages several (``backfill.random_permutations``).
    draws_from_seed: ClassVar[bool] = False

    @property
    def deployable(self) -> bool:
        return self.score is None or score_kind_of(self.score).deployable

    def available(self, inputs: OrderingInputs) -> bool:
        """Whether ``inputs`` hold what this policy's score is computed from."""
        return self.score is None or score_kind_of(self.score).available(inputs)

    def orders_for(self, mode: str) -> bool:
        """Whether this policy's order is meaningful for the ``mode`` serving mode."""
        return self.serving_modes is None or mode in self.serving_modes

    def order(self, n: int, scores: np.ndarray | None = None, seed: int = 0) -> np.ndarray:
        """A permutation of positions 0..n-1, first backfilled first."""
        if self.score is None:
            return self.draw(n, seed)
        if scores is None:
            raise UserError(
                f"ordering policy {self.registry_name!r} orders by the {self.score!r} score, which "
                "was not given",
                hint=self.description,
            )
        scores = np.asarray(scores, dtype=np.float64)
        if scores.shape != (n,) or not np.isfinite(scores).all():
            raise UserError(
                f"ordering policy {self.registry_name!r} needs {n} finite {self.score!r} scores, "
                f"got shape {scores.shape}",
                hint=self.description,
            )
        return np.argsort(-scores if self.descending else scores, kind="stable")

    def order_items(self, inputs: OrderingInputs, seed: int = 0) -> np.ndarray:
        """``order`` with the score computed from ``inputs`` (the simulator's path)."""
        scores = None if self.score is None else inputs.score(self.score)
        return self.order(inputs.n, scores, seed)

    def draw(self, n: int, seed: int) -> np.ndarray:
        """The order of a policy without a score."""
        raise NotImplementedError(f"{type(self).__name__} orders by a score")


ORDERINGS: Registry[OrderingPolicy] = Registry("backfill ordering policy")


def build_ordering(name: str) -> OrderingPolicy:
    return ORDERINGS.get(name)()
