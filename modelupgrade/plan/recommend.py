"""The recommendation rule (``modelupgrade.plan``'s docstring): the cheapest option close enough to
re-embedding and better than the old model."""

from __future__ import annotations

from collections.abc import Sequence

from modelupgrade.plan.records import PlanRow, Recommendation, duration, percent

# One-time costs this close to the cheapest eligible option's count as equal (timing noise between
# two models of one architecture, milliseconds of fitting): among them the best M wins.
COST_TIE_FRACTION, COST_TIE_SECONDS = 0.10, 60.0


def recommend(
    rows: Sequence[PlanRow], metric: str, m_old: float, m_new: float, tolerance_pct: float
) -> Recommendation:
    """The cheapest measured option within ``tolerance_pct`` % of M(new, new) and above
    M(old, old), the best M among those as cheap as it; the old model when there is none
    (module docstring)."""
    floor = (1 - tolerance_pct / 100) * m_new
    candidates = [r for r in rows if r.kind != "keep" and r.M is not None]
    eligible = [r for r in candidates if r.M is not None and r.M >= floor and r.M > m_old]
    if not eligible:
        return Recommendation(
            "keep-old",
            f"no option beats keeping the old model ({metric} {m_old:.4f}) while staying within "
            f"{tolerance_pct:g}% of re-embedding ({m_new:.4f}); the upgrade is not worth its cost "
            "on this sample.",
        )
    cheapest = min(r.one_time_seconds for r in eligible)
    margin = max(COST_TIE_FRACTION * cheapest, COST_TIE_SECONDS)
    tied = [r for r in eligible if r.one_time_seconds <= cheapest + margin]
    best = max(tied, key=lambda r: (r.M or 0.0, -r.one_time_seconds))
    assert best.M is not None
    reason = (
        f"the cheapest option (one-time {duration(best.one_time_seconds)}) whose {metric} "
        f"{best.M:.4f} is within {tolerance_pct:g}% of re-embedding's {m_new:.4f} "
        f"({best.M / m_new * 100:.1f}% of it) and above the old model's {m_old:.4f} "
        f"({(best.M - m_old) / m_old * 100:+.1f}%)."
    )
    if len(tied) > 1:
        others = ", ".join(f"{r.option} ({r.M:.4f})" for r in tied if r is not best)
        reason += (
            f" As cheap (within {COST_TIE_FRACTION:.0%} or {COST_TIE_SECONDS:g} s) but lower "
            f"{metric}: {others}."
        )
    below = [
        r for r in candidates if r.one_time_seconds < best.one_time_seconds and r not in eligible
    ]
    if below:
        shown = ", ".join(
            f"{r.option} ({metric} {r.M:.4f}, {percent(r.M / m_new * 100 if m_new else None)} "
            "of re-embedding)"
            for r in below
            if r.M is not None
        )
        reason += f" Cheaper but below the bar: {shown}."
    if best.query_overhead_us is not None:
        reason += f" Every query pays the adapter: {best.query_overhead_us:.2f} µs."
    return Recommendation(best.option, reason, [r.option for r in eligible])
