"""Reference order: largest error of the mixed index's old-state vector, ‖φ_new(g) − ψ(φ_old(g))‖
(or ‖φ_new(g) − φ_old(g)‖ without ψ), first.

It reads every new embedding, which exists only once the backfill is done: not deployable. It is
not an upper bound on the curve, and not FastFill's "Cheating" order (which ranks by the per-item
training loss, labels included). Its score is the error of the vector the mixed index serves, so it
orders only that mode's backfill: the rank-merge modes serve the old part with old queries. Across
spaces that were never aligned (an independently trained new model without ψ) the distance means
nothing, so the order is not offered there.
"""

from __future__ import annotations

from modelupgrade.ordering.base import ORDERINGS, OrderingPolicy


@ORDERINGS.register("oracle")
class LargestAlignmentErrorFirst(OrderingPolicy):
    description = (
        "needs the new gallery vectors and old-state vectors in the new space: ψ(old), or the old "
        "vectors of a model trained to be compatible (oracle)"
    )
    score = "alignment-error"
    serving_modes = ("mixed",)
