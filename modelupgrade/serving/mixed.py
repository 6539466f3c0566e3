"""(a) One mixed index: the new query against φ_new(g) where backfilled, else ψ(φ_old(g)) — or
φ_old(g) itself when no forward head is given (BCT-style compatible models serve the raw old
vectors; the store refuses that for spaces not trained to be compatible)."""

from __future__ import annotations

from modelupgrade.serving.base import SERVING_MODES, Pairing, ServingMode


@SERVING_MODES.register("mixed")
class MixedIndex(ServingMode):
    description = "needs the new query, the new gallery vectors, and ψ(old) or the old vectors"
    old_part = (Pairing("new", "forward"), Pairing("new", "stored"))
