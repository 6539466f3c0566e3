"""Reference partial-backfill curve (FastFill protocol), built from the leave-one-out metrics.

Straightforward and exact, not fast: every point re-ranks the whole gallery. The backfill simulator
is checked against it.
"""

from __future__ import annotations

import numpy as np
import torch

from modelupgrade.errors import UserError
from modelupgrade.metrics.ranking import cmc_from_ranking, map_from_ranking
from modelupgrade.metrics.similarity import rank_features
from modelupgrade.retrieval.distance import Similarity


def backfill_cutoffs(num_items: int, steps: int) -> np.ndarray:
    """floor(i·n/(B+1)) for i = 0 … B+1: how many items are backfilled at each curve point."""
    if steps < 0:
        raise UserError(f"backfill steps must be ≥ 0, got {steps}")
    i = np.arange(steps + 2, dtype=np.int64)
    return (i * num_items) // (steps + 1)


def mixed_gallery(
    old: np.ndarray, new: np.ndarray, ordering: np.ndarray, cutoff: int
) -> np.ndarray:
    """Gallery with the first ``cutoff`` items of ``ordering`` holding their new feature."""
    gallery = np.array(old, copy=True)
    refreshed = np.asarray(ordering)[:cutoff]
    gallery[refreshed] = new[refreshed]
    return gallery


def backfill_curve_reference(
    old: np.ndarray,
    new: np.ndarray,
    labels: np.ndarray,
    ordering: np.ndarray,
    steps: int,
    similarity: Similarity = "euclidean",
    topk: tuple[int, ...] = (1, 5),
) -> dict[str, np.ndarray | float]:
    """Top-k CMC (all queries) and step-AP mAP (queries with a positive) at each of the B+2 points,
    new-model queries against the mixed gallery, leave-one-out; AUC = plain mean of the points.
    """
    old = np.asarray(old)
    new = np.asarray(new)
    ordering = np.asarray(ordering, dtype=np.int64)
    if old.shape != new.shape:
        raise UserError(
            f"old and new features differ in shape: {old.shape} vs {new.shape}",
            hint="the reference curve needs old and new features of the same space",
        )
    if sorted(ordering.tolist()) != list(range(len(old))):
        raise UserError("ordering must be a permutation of the gallery indices")
    curve: dict[str, list[float]] = {f"top{k}": [] for k in topk}
    curve["mAP"] = []
    for cutoff in backfill_cutoffs(len(old), steps):
        gallery = mixed_gallery(old, new, ordering, int(cutoff))
        ranking = rank_features(
            new,
            gallery,
            labels,
            labels,
            similarity=similarity,
            leave_one_out=True,
            dtype=torch.float64,
        )
        for k, value in cmc_from_ranking(ranking, topk, "count-as-miss").items():
            curve[f"top{k}"].append(value)
        curve["mAP"].append(map_from_ranking(ranking))
    result: dict[str, np.ndarray | float] = {
        name: np.asarray(values) for name, values in curve.items()
    }
    for name, values in curve.items():
        result[f"auc_{name}"] = float(np.mean(values))
    return result
