"""Upper bound: largest error of the served old-state vector, ‖φ_new(g) − ψ(φ_old(g))‖, first.

It reads every new embedding, which exists only once the backfill is done: not deployable.
"""

from __future__ import annotations

from modelupgrade.ordering.base import ORDERINGS, OrderingPolicy


@ORDERINGS.register("oracle")
class LargestAlignmentErrorFirst(OrderingPolicy):
    description = (
        "needs the new gallery vectors and the old-state vectors in the same space (oracle)"
    )
    score = "alignment-error"
