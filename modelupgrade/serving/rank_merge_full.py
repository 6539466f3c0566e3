"""(d) Seo et al.'s full method (§4.3): the backfilled part holds ρ(φ_new(g)) and is searched with
ρ(φ_new(q)); the old part φ_old(g) is searched with ψ_rev(ρ(φ_new(q)))."""

from __future__ import annotations

from modelupgrade.serving.base import SERVING_MODES, Pairing, ServingMode


@SERVING_MODES.register("rank-merge-full")
class FullMethodRankMerge(ServingMode):
    description = (
        "needs ρ and ψ_rev from an rm_full head, with the backfilled part holding ρ(φ_new(g))"
    )
    old_part = (Pairing("rho_reverse", "stored"),)
    new_part = Pairing("rho", "rho")
