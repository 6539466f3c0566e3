"""How the study report writes its numbers: one rule, said in the report (``PRECISION_RULE``).

- a retrieval metric (M, an AUC) or a fraction (a flip rate, an accuracy, a cosine): 3 decimals;
  the claims' own lines keep 4, where two Ms a few thousandths apart are what a check compares;
- a percentage: 1 decimal (the claims' Δ↑ and Δ↓ keep 2, as DMU's tables print them);
- a p-value: 3 decimals, or "< 0.001";
- a number over seeds: mean ± sample standard deviation, both at the number's own precision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from modelupgrade.report.document import MISSING

M_DIGITS = 3
PERCENT_DIGITS = 1
P_DIGITS = 3

PRECISION_RULE = (
    "Numbers: retrieval metrics (M, AUC) and fractions (flip rates, accuracies, cosines) to 3 "
    "decimals, percentages to 1, p-values to 3 (or < 0.001); the claims' lines keep 4 decimals "
    "for M and 2 for DMU's Δ↑/Δ↓ %, where differences of a few thousandths decide a check. A "
    "number over seeds is its mean ± the sample standard deviation over the seeds."
)


def fixed(value: float | None, digits: int = M_DIGITS, sign: bool = False) -> str:
    """``value`` with ``digits`` decimals (a leading + with ``sign``); ``–`` for None or NaN."""
    if value is None or math.isnan(value):
        return MISSING
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def p_value(p: float) -> str:
    """A p-value: 3 decimals, or "< 0.001"; ``–`` where there is none."""
    if math.isnan(p):
        return MISSING
    return "< 0.001" if p < 0.001 else f"{p:.{P_DIGITS}f}"


def spread(values: Sequence[float], digits: int = M_DIGITS, sign: bool = False) -> str:
    """Mean ± sample standard deviation of ``values`` (the finite ones); the value alone where
    there is one; ``–`` where there is none."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return MISSING
    mean = math.fsum(finite) / len(finite)
    if len(finite) == 1:
        return fixed(mean, digits, sign)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in finite) / (len(finite) - 1))
    return f"{fixed(mean, digits, sign)} ± {sd:.{digits}f}"
