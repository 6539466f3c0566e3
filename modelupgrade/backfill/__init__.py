"""Online-backfilling simulator: ordering policies × serving modes, the whole curve in one pass.

The policies and modes themselves are ``modelupgrade.ordering`` and ``modelupgrade.serving``: the
real store runs the same ones, so a simulated curve is what the store serves at each fraction.
"""

from modelupgrade.backfill.engine import (
    CurveResult,
    PerQueryCurve,
    SearchSystems,
    backfill_curve,
    backfill_curves,
    first_new_step,
)
from modelupgrade.backfill.grid import BackfillGrid, fastfill_grid, fraction_grid, uniform_grid
from modelupgrade.backfill.serving_arrays import ServingArrays
from modelupgrade.backfill.simulate import evaluate_state, naive_curve, resolve_grid, simulate_curve
from modelupgrade.backfill.summary import (
    BackfillConditions,
    auc_mean,
    auc_trapezoid,
    check_conditions,
)

__all__ = [
    "BackfillConditions",
    "BackfillGrid",
    "CurveResult",
    "PerQueryCurve",
    "SearchSystems",
    "ServingArrays",
    "auc_mean",
    "auc_trapezoid",
    "backfill_curve",
    "backfill_curves",
    "check_conditions",
    "evaluate_state",
    "fastfill_grid",
    "first_new_step",
    "fraction_grid",
    "naive_curve",
    "resolve_grid",
    "simulate_curve",
    "uniform_grid",
]
