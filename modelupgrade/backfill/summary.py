"""Curve summaries: AUC (FastFill's mean of the points; the trapezoid integral) and Seo et al.'s
three conditions for online backfilling."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


def auc_mean(values: np.ndarray) -> float:
    """FastFill's backfilling metric: the plain mean over the evaluation points."""
    return float(np.mean(values))


def auc_trapezoid(t: np.ndarray, values: np.ndarray) -> float:
    """∫₀¹ M_t dt by the trapezoid rule over the points (Seo et al.'s AUC)."""
    t = np.asarray(t, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    return float(np.sum((t[1:] - t[:-1]) * (v[1:] + v[:-1]) / 2.0))


@dataclass(frozen=True)
class BackfillConditions:
    """Seo et al. Eqs. 6–8: start ≥ old/old, end ≥ new/new, non-decreasing in t."""

    starts_at_or_above_old: bool
    ends_at_or_above_new: bool
    monotone: bool
    largest_drop: float

    @property
    def all_met(self) -> bool:
        return self.starts_at_or_above_old and self.ends_at_or_above_new and self.monotone

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "all_met": self.all_met}


def check_conditions(values: np.ndarray, old_old: float, new_new: float, tolerance: float = 1e-9) -> BackfillConditions:
    values = np.asarray(values, dtype=np.float64)
    drops = values[:-1] - values[1:]
    return BackfillConditions(
        starts_at_or_above_old=bool(values[0] >= old_old - tolerance),
        ends_at_or_above_new=bool(values[-1] >= new_new - tolerance),
        monotone=bool(np.all(drops <= tolerance)),
        largest_drop=float(max(drops.max(initial=0.0), 0.0)),
    )
