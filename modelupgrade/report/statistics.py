"""The rules that turn a check's numbers over paired seeds into a verdict a reviewer accepts.

A check compares two numbers of the same training seed (M(BCT, old) against M(old, old), an AUC
against another), so its margin (> 0 in the paper's direction) is a paired difference. Over the
seeds that measured it:

- a paired t-test of the mean margin against zero (two-sided; n − 1 degrees of freedom);
- Holm's step-down correction across the checks of one claim, so that the chance of any false
  "holds" or "fails" among them stays below α;
- a check holds where its Holm-adjusted p-value is below α and the mean margin is positive, fails
  where it is below α and the mean is negative (the adjusted interval then excludes the paper's
  direction), and is inconclusive otherwise — also when fewer than ``MIN_SEEDS`` seeds measured
  it, since a t-test on two seeds says next to nothing.

A claim fails where one of its checks fails, holds where every one holds, and is inconclusive
otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

# Significance level of every verdict (after Holm's correction within a claim).
ALPHA = 0.05
# Fewest paired seeds a check is tested on.
MIN_SEEDS = 3
HOLDS, FAILS, INCONCLUSIVE, NOT_TESTED = "holds", "fails", "inconclusive", "not tested"


@dataclass(frozen=True)
class PairedTest:
    """A paired t-test of margins against zero: their count, mean and sample standard deviation,
    the t statistic, the two-sided p-value, and the 95 % confidence interval of the mean (NaN
    where fewer than two margins, or no spread with a zero mean)."""

    n: int
    mean: float
    sd: float
    t: float
    p: float
    low: float
    high: float

    @classmethod
    def of(cls, margins: Sequence[float]) -> PairedTest:
        n = len(margins)
        if n == 0:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
        values = np.asarray(margins, dtype=np.float64)
        mean = float(values.mean())
        if n < 2:
            return cls(n, mean, math.nan, math.nan, math.nan, math.nan, math.nan)
        with np.errstate(invalid="ignore"):
            sd = float(values.std(ddof=1))
        if not (math.isfinite(mean) and math.isfinite(sd)):
            # An infinite margin (a Δ against a zero reference) has a sign but no spread.
            p = 1.0 if mean == 0 or math.isnan(mean) else 0.0
            return cls(n, mean, sd, math.nan, p, math.nan, math.nan)
        se = sd / math.sqrt(n)
        if se == 0:
            # Every seed gave the same margin: certain in its sign, unless it is zero.
            p = 1.0 if mean == 0 else 0.0
            return cls(n, mean, sd, math.copysign(math.inf, mean) if mean else 0.0, p, mean, mean)
        t = mean / se
        p = float(2 * stats.t.sf(abs(t), df=n - 1))
        half = float(stats.t.ppf(0.975, df=n - 1)) * se
        return cls(n, mean, sd, t, p, mean - half, mean + half)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaN stays NaN and takes no share of the correction)."""
    ranked = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    adjusted = [math.nan] * len(p_values)
    running, m = 0.0, len(ranked)
    for rank, (p, i) in enumerate(ranked):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def check_verdict(test: PairedTest, adjusted_p: float, alpha: float = ALPHA) -> str:
    """A check's verdict from its paired test and its Holm-adjusted p-value."""
    if test.n < MIN_SEEDS or math.isnan(adjusted_p) or adjusted_p >= alpha:
        return INCONCLUSIVE
    return HOLDS if test.mean > 0 else FAILS


def claim_verdict(verdicts: Sequence[str]) -> str:
    """A claim's verdict from its tested checks' verdicts."""
    tested = [v for v in verdicts if v != NOT_TESTED]
    if not tested:
        return NOT_TESTED
    if FAILS in tested:
        return FAILS
    return HOLDS if all(v == HOLDS for v in tested) else INCONCLUSIVE


def joint_bootstrap_se(
    per_query: Sequence[np.ndarray | None],
    combine: Callable[..., np.ndarray],
    draws: int = 1000,
    seed: int = 0,
) -> float:
    """The standard error of ``combine(mean of each per-query array)`` when the test queries are
    drawn again with replacement, the same draw for every array (they are the same queries). A
    NaN entry (a query without a positive) is left out of its array's mean, as mAP leaves it out.
    NaN where an array is missing."""
    if any(values is None for values in per_query):
        return math.nan
    arrays = [np.asarray(values, dtype=np.float64) for values in per_query]
    size = len(arrays[0])
    if size < 2 or any(len(values) != size for values in arrays):
        return math.nan
    picks = np.random.default_rng(seed).integers(0, size, size=(draws, size))
    with np.errstate(invalid="ignore"):
        means = [np.nanmean(values[picks], axis=1) for values in arrays]
        outcomes = combine(*means)
    outcomes = outcomes[np.isfinite(outcomes)]
    return float(outcomes.std(ddof=1)) if outcomes.size > 1 else math.nan
