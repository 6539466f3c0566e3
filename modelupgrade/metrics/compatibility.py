"""Upgrade metrics: negative flips, DMU's Δ↑ / Δ↓, and compatibility-matrix
metrics over generations.

Compatibility matrix ``M`` (T × T): ``M[i, j]`` is the retrieval score with queries embedded by
generation i and the gallery by generation j (j ≤ i; the upper triangle is ignored). The empirical
compatibility criterion is M[i, j] > M[j, j]: the newer query model searching the older gallery
beats the older model searching its own gallery.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from modelupgrade.errors import UserError

ViolationRule = Literal["lt", "le"]


def negative_flips(old_correct: np.ndarray, new_correct: np.ndarray) -> np.ndarray:
    """Boolean per query: right (e.g. top-1) under the old system and wrong under the new one."""
    old_correct = np.asarray(old_correct, dtype=bool)
    new_correct = np.asarray(new_correct, dtype=bool)
    if old_correct.shape != new_correct.shape:
        raise UserError(
            f"per-query correctness arrays differ in shape: {old_correct.shape} "
            f"vs {new_correct.shape}",
            hint="both systems must answer the same queries, in the same order",
        )
    return old_correct & ~new_correct


def negative_flip_rate(old_correct: np.ndarray, new_correct: np.ndarray) -> float:
    """Fraction of ALL queries that flip from right to wrong (this project's
    definition, after PCT)."""
    flips = negative_flips(old_correct, new_correct)
    return float(flips.mean()) if flips.size else float("nan")


def upgrade_gain(cross: float, old_self: float) -> float:
    """DMU Δ↑ (Eq. 6), percent: (M(φ_n, φ_o) − M(φ_o, φ_o)) / M(φ_o, φ_o) × 100."""
    if old_self == 0:
        return float("nan")
    return (cross - old_self) / old_self * 100.0


def degradation(new_self: float, oracle_self: float) -> float:
    """DMU Δ↓ (Eq. 7), percent: (M(φ_n^oracle, φ_n^oracle) − M(φ_n, φ_n)) / M(oracle) × 100.

    The oracle is the new architecture trained on the new data with no compatibility loss; a
    negative value means the compatible model beats it on self-test.
    """
    if oracle_self == 0:
        return float("nan")
    return (oracle_self - new_self) / oracle_self * 100.0


def _check_matrix(matrix: np.ndarray) -> np.ndarray:
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise UserError(f"a compatibility matrix must be square (T × T), got shape {matrix.shape}")
    return matrix


def average_compatibility(matrix: np.ndarray, violation: ViolationRule = "lt") -> float:
    """AC: fraction of generation pairs i > j that are compatible, over the T(T−1)/2 pairs (over
    those measured: a NaN cell, e.g. a newer model of another dimension that reaches the older
    gallery only through a head, is no pair; none measured: NaN).

    ``violation="lt"`` (CoReS / CL2R): a pair is incompatible only if M[i, j] < M[j, j], so ties
    count as compatible. ``violation="le"`` (iamcl2r): M[i, j] ≤ M[j, j] is already a violation.
    """
    matrix = _check_matrix(matrix)
    if violation not in ("lt", "le"):
        raise UserError(
            f"unknown AC violation rule {violation!r}", hint="use 'lt' (CoReS) or 'le' (iamcl2r)"
        )
    t = len(matrix)
    if t < 2:
        return float("nan")
    rows, cols = np.tril_indices(t, k=-1)
    cross, reference = matrix[rows, cols], np.diag(matrix)[cols]
    measured = ~(np.isnan(cross) | np.isnan(reference))
    if not measured.any():
        return float("nan")
    violated = cross < reference if violation == "lt" else cross <= reference
    return float((~violated & measured).sum() / measured.sum())


def average_multimodel_accuracy(matrix: np.ndarray) -> float:
    """AM (CoReS): mean of the lower-triangle-and-diagonal entries that are > 0
    (0 = not measured)."""
    matrix = _check_matrix(matrix)
    values = matrix[np.tril_indices(len(matrix))]
    values = values[values > 0]
    return float(values.mean()) if len(values) else float("nan")


def backward_compatibility(matrix: np.ndarray) -> float:
    """BC (CL2R): mean over i < T of M[T, i] − M[i, i] (the last model's queries
    on every old gallery)."""
    return _mean_cross_gap(matrix, lambda t: (t - 1, np.arange(t - 1), np.arange(t - 1)))


def forward_compatibility(matrix: np.ndarray) -> float:
    """FC (CL2R): mean over i ≥ 1 of M[i, i−1] − M[i, i] (each model on the
    gallery just before it)."""
    return _mean_cross_gap(matrix, lambda t: (np.arange(1, t), np.arange(t - 1), np.arange(1, t)))


def _mean_cross_gap(
    matrix: np.ndarray, pairs: Callable[[int], tuple[Any, np.ndarray, np.ndarray]]
) -> float:
    """Mean of M[q, g] − M[s, s] over the (queries q, galleries g, models s) that ``pairs`` gives
    for T models; NaN with fewer than two models."""
    matrix = _check_matrix(matrix)
    t = len(matrix)
    if t < 2:
        return float("nan")
    query, gallery, own = pairs(t)
    return float((matrix[query, gallery] - matrix[own, own]).mean())


def compatibility_summary(matrix: np.ndarray) -> dict[str, float]:
    """AC under both criteria, AM, BC and FC of one compatibility matrix."""
    return {
        "ac_lt": average_compatibility(matrix, "lt"),
        "ac_le": average_compatibility(matrix, "le"),
        "am": average_multimodel_accuracy(matrix),
        "bc": backward_compatibility(matrix),
        "fc": forward_compatibility(matrix),
    }
