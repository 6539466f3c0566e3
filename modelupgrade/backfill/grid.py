"""Backfill time grids: which prefix of the backfill order holds new vectors at
each evaluation point."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modelupgrade.errors import UserError


@dataclass(frozen=True)
class BackfillGrid:
    """Evaluation points of a backfill curve: nominal fraction ``t`` and exact item ``cutoffs``.

    At point i the first ``cutoffs[i]`` items of the backfill order hold their new vector.
    """

    t: np.ndarray
    cutoffs: np.ndarray

    def __len__(self) -> int:
        return len(self.cutoffs)


def uniform_grid(points: int, n: int) -> BackfillGrid:
    """``points`` equally spaced fractions t_i = i / (points - 1); cutoff_i =
    floor(i·n / (points - 1)).

    Integer arithmetic, so t = 0.3 of 10 items is exactly 3 items (no float rounding down to 2).
    """
    if points < 2:
        raise UserError(f"a backfill curve needs at least 2 points, got {points}")
    if n < 1:
        raise UserError("the gallery is empty; there is nothing to backfill")
    i = np.arange(points, dtype=np.int64)
    return BackfillGrid(i / (points - 1), (i * n) // (points - 1))


def fastfill_grid(steps: int, n: int) -> BackfillGrid:
    """FastFill's grid of ``steps`` = B intermediate states: B + 2 points,
    cutoff_i = floor(i·n/(B+1))."""
    if steps < 0:
        raise UserError(f"FastFill's number of backfill steps must be ≥ 0, got {steps}")
    return uniform_grid(steps + 2, n)


def fraction_grid(fractions: np.ndarray | list[float], n: int) -> BackfillGrid:
    """Arbitrary non-decreasing fractions in [0, 1]; cutoff = floor(t·n)."""
    t = np.asarray(fractions, dtype=np.float64)
    if t.ndim != 1 or len(t) == 0:
        raise UserError("backfill fractions must be a non-empty 1-D list")
    if np.any(t < 0) or np.any(t > 1) or np.any(np.diff(t) < 0):
        raise UserError(
            "backfill fractions must be non-decreasing values in [0, 1]", hint=f"got {t.tolist()}"
        )
    return BackfillGrid(t, np.floor(t * n + 1e-9).astype(np.int64))
