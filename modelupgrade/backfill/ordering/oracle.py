"""Upper bound: largest error of the served old-state vector, ‖φ_new(g) − ψ(φ_old(g))‖, first.

It reads every new embedding, which exists only once the backfill is done: not deployable.
"""

from __future__ import annotations

import numpy as np

from modelupgrade.backfill.ordering.base import ORDERINGS, OrderingContext, OrderingPolicy, rows_of
from modelupgrade.errors import UserError


@ORDERINGS.register("oracle")
class LargestAlignmentErrorFirst(OrderingPolicy):
    deployable = False
    description = "needs the new gallery vectors and the old-state vectors in the same space (oracle)"

    def available(self, context: OrderingContext) -> bool:
        return (context.new_vectors is not None and context.old_state_vectors is not None
                and np.shape(context.new_vectors)[1:] == np.shape(context.old_state_vectors)[1:])

    def scores(self, context: OrderingContext) -> np.ndarray:
        new = rows_of(context.new_vectors, context.n, "new gallery vectors").astype(np.float64)
        old = rows_of(context.old_state_vectors, context.n, "old-state gallery vectors").astype(np.float64)
        if new.shape != old.shape:
            raise UserError(f"new vectors {new.shape} and old-state vectors {old.shape} differ in shape")
        return np.linalg.norm(new - old, axis=1)
