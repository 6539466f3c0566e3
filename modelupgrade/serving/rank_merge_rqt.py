"""(c) Rank merge with the reverse query transform (Seo et al. §4.1): one backbone pass;
ψ_rev(φ_new(q)) searches the old part, φ_new(q) the new part."""

from __future__ import annotations

from modelupgrade.serving.base import SERVING_MODES, Pairing, ServingMode


@SERVING_MODES.register("rank-merge-rqt")
class ReverseQueryRankMerge(ServingMode):
    description = "needs ψ_rev(φ_new(q)) from a reverse head (rqt or mcl)"
    old_part = (Pairing("reverse", "stored"),)
