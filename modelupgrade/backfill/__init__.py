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

from modelupgrade.backfill.ordering import ORDERINGS, OrderingContext, OrderingPolicy, build_ordering  # noqa: E402
from modelupgrade.backfill.serving import (  # noqa: E402
    SERVING_MODES,
    ServingArrays,
    ServingMode,
    build_serving_mode,
)
from modelupgrade.backfill.summary import (  # noqa: E402
    BackfillConditions,
    auc_mean,
    auc_trapezoid,
    check_conditions,
)

__all__ += [
    "ORDERINGS",
    "SERVING_MODES",
    "BackfillConditions",
    "OrderingContext",
    "OrderingPolicy",
    "ServingArrays",
    "ServingMode",
    "auc_mean",
    "auc_trapezoid",
    "build_ordering",
    "build_serving_mode",
    "check_conditions",
]
