"""Losses shared by several heads: distances, and Seo et al.'s metric-compatible contrastive loss.

MCL (Eq. 11 of "Metric Compatible Training for Online Backfilling") for anchor i, with
s^old_ik = exp(-d(q_old(x_i), φ_old(x_k))) and s^new_ik = exp(-d(n(x_i), n(x_k))):

    -log Σ_P s^old / (Σ_P s^old + Σ_N s^old + Σ_N s^new)
        -  log Σ_P s^new / (Σ_P s^new + Σ_N s^new + Σ_N s^old)

Positives are summed *inside* the log (not SupCon's mean of logs), each denominator holds the
negatives of both systems, and there is no temperature in the paper (``temperature`` = 1). Hard
mining keeps, per anchor, the farthest half of the positives and the nearest half of the negatives.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

Distance = Literal["cosine", "l2"]
# How a squared error is reduced over the dimensions: "mean" is the FCT code's nn.MSELoss, "sum"
# the papers' ‖·‖².
Reduction = Literal["mean", "sum"]


def paired_distance(a: torch.Tensor, b: torch.Tensor, distance: Distance) -> torch.Tensor:
    """Row-wise distance between a[i] and b[i], shape (N,)."""
    if distance == "cosine":
        return 1.0 - F.cosine_similarity(a, b, dim=1)
    return (a - b).pow(2).sum(dim=1).clamp_min(1e-12).sqrt()


def squared_error(a: torch.Tensor, b: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    """Row-wise squared error between a[i] and b[i] over the dimensions, shape (N,)."""
    squared = (a - b).pow(2)
    return squared.mean(dim=1) if reduction == "mean" else squared.sum(dim=1)


def pairwise_distance(a: torch.Tensor, b: torch.Tensor, distance: Distance) -> torch.Tensor:
    """All-pairs distance matrix (N, M) between the rows of a and b."""
    if distance == "cosine":
        return 1.0 - F.normalize(a, dim=1) @ F.normalize(b, dim=1).T
    return torch.cdist(a, b).clamp_min(0.0)


def hardest_fraction(
    distances: torch.Tensor, candidates: torch.Tensor, fraction: float, farthest: bool
) -> torch.Tensor:
    """Per row, keep ceil(fraction · |candidates|) candidates: the farthest (or nearest) ones.

    ``candidates`` is a boolean (N, M) mask; the result is a sub-mask of it. A row keeps every
    candidate up to its threshold, the keep-th key in sorted order, so a tie at the threshold
    keeps all the tied candidates.
    """
    key = distances.detach()
    if farthest:
        key = -key
    key = key.masked_fill(~candidates, float("inf"))
    keep = torch.ceil(candidates.sum(dim=1, keepdim=True) * fraction).long()
    threshold = _sorted_rows(key).gather(1, (keep - 1).clamp_min(0))
    return candidates & (key <= threshold)


def _sorted_rows(values: torch.Tensor) -> torch.Tensor:
    # On the CPU, numpy's row sort is ~30× faster than torch's at MCL's batch sizes (512 × 512:
    # 0.3 ms against 11 ms on one thread), and mining sorts four such matrices per step.
    if values.device.type == "cpu":
        return torch.from_numpy(np.sort(values.numpy(), axis=1))
    return values.sort(dim=1).values


def metric_compatible_contrastive_loss(
    old_side_distances: torch.Tensor,
    new_side_distances: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    hard_mining: bool = True,
    mining_fraction: float = 0.5,
    mining_scope: Literal["per_system", "joint"] = "per_system",
    self_positive_old: bool = True,
    self_positive_new: bool = False,
    heterogeneous_negatives: bool = True,
) -> torch.Tensor:
    """Mean MCL over the anchors that have at least one positive in each system.

    ``old_side_distances[i, k]`` = d(query-side transform of x_i, φ_old(x_k)) (the backward system);
    ``new_side_distances[i, k]`` = d(new-side embedding of x_i, new-side embedding of x_k).
    ``heterogeneous_negatives=False`` gives the CL-M ablation (each system on its own).
    """
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    positives_old = same if self_positive_old else same & ~eye
    positives_new = same if self_positive_new else same & ~eye
    negatives = ~same
    negatives_old = negatives_new = negatives
    if hard_mining:
        if mining_scope == "joint":
            joint = 0.5 * (old_side_distances + new_side_distances)
            positives_old = hardest_fraction(joint, positives_old, mining_fraction, farthest=True)
            positives_new = hardest_fraction(joint, positives_new, mining_fraction, farthest=True)
            negatives_old = negatives_new = hardest_fraction(
                joint, negatives, mining_fraction, farthest=False
            )
        else:
            positives_old = hardest_fraction(
                old_side_distances, positives_old, mining_fraction, True
            )
            positives_new = hardest_fraction(
                new_side_distances, positives_new, mining_fraction, True
            )
            negatives_old = hardest_fraction(old_side_distances, negatives, mining_fraction, False)
            negatives_new = hardest_fraction(new_side_distances, negatives, mining_fraction, False)

    log_s_old = -old_side_distances / temperature
    log_s_new = -new_side_distances / temperature

    def masked_logsumexp(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return values.masked_fill(~mask, float("-inf")).logsumexp(dim=1)

    pos_old = masked_logsumexp(log_s_old, positives_old)
    pos_new = masked_logsumexp(log_s_new, positives_new)
    neg_old = masked_logsumexp(log_s_old, negatives_old)
    neg_new = masked_logsumexp(log_s_new, negatives_new)
    if heterogeneous_negatives:
        denominator_old = torch.stack([pos_old, neg_old, neg_new]).logsumexp(dim=0)
        denominator_new = torch.stack([pos_new, neg_new, neg_old]).logsumexp(dim=0)
    else:
        denominator_old = torch.stack([pos_old, neg_old]).logsumexp(dim=0)
        denominator_new = torch.stack([pos_new, neg_new]).logsumexp(dim=0)
    valid = positives_old.any(dim=1) & positives_new.any(dim=1)
    if not bool(valid.any()):
        raise ValueError(
            "no anchor in the batch has a positive in both systems; use class-balanced batches "
            "with at least two images per class"
        )
    per_anchor = (denominator_old - pos_old) + (denominator_new - pos_new)
    return per_anchor[valid].mean()
