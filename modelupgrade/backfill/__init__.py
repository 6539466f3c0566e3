"""Online backfilling simulator: ordering policies × serving modes, the whole curve in one pass."""

from modelupgrade.backfill.engine import (
    DISTANCES,
    CurveResult,
    PerQueryCurve,
    SearchSystems,
    backfill_curve,
    first_new_step,
)
from modelupgrade.backfill.grid import BackfillGrid, fastfill_grid, fraction_grid, uniform_grid
from modelupgrade.backfill.simulate import evaluate_state, naive_curve, resolve_grid, simulate_curve

__all__ = [
    "DISTANCES",
    "BackfillGrid",
    "CurveResult",
    "PerQueryCurve",
    "SearchSystems",
    "backfill_curve",
    "evaluate_state",
    "fastfill_grid",
    "first_new_step",
    "fraction_grid",
    "naive_curve",
    "resolve_grid",
    "simulate_curve",
    "uniform_grid",
]
