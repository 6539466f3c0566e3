"""(b) Distance rank merge (Seo et al. §3.2): φ_old(q) searches the old part, φ_new(q) the new part,
merged by raw distance (two backbone passes per query)."""

from __future__ import annotations

from modelupgrade.serving.base import SERVING_MODES, Pairing, ServingMode


@SERVING_MODES.register("rank-merge")
class DistanceRankMerge(ServingMode):
    description = "needs the query embedded by both models (φ_old(q) and φ_new(q))"
    old_part = (Pairing("old", "stored"),)
