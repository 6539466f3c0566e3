"""Label-based retrieval metrics over a full ranking: CMC top-k, step AP, truncated AP@k.

Relevance is "same label as the query". Every function takes a score matrix (queries × gallery,
higher = closer; pass ``-distances`` for a distance) and works on blocks of query rows, so a large
matrix is never sorted at once. Two protocols differ in who the queries are:

- query/gallery: queries and gallery are different sets;
- leave-one-out: the query set *is* the gallery set; query ``i`` never retrieves gallery row ``i``
  (self-exclusion by index, as in open-reid / apple ml-fct / FastFill).

The rule for a query whose label has no gallery item (no positive) is named per metric:

- ``"count-as-miss"`` (CMC): the query stays in the denominator and never hits; FastFill's
  ``cmc_optimized`` (denominator = all queries).
- ``"exclude"``: the query is left out of the mean; open-reid/ml-fct ``cmc`` and ``mean_ap``,
  revisitop ``compute_map``.
- ``"count-as-zero"`` (AP@k): the query counts with AP 0; the GLDv2 / Kaggle mAP@100.

Step AP is scikit-learn's ``average_precision_score`` on (relevance, score): the finite sum of
precision × Δrecall over the distinct score thresholds, so gallery items with tied scores form one
threshold. CMC and AP@k read the ranked list as sorted (ties in gallery order, stable).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from modelupgrade.arrays import label_vectors
from modelupgrade.errors import UserError

NoPositiveRule = Literal["count-as-miss", "count-as-zero", "exclude"]
NO_POSITIVE_RULES: tuple[str, ...] = ("count-as-miss", "count-as-zero", "exclude")

# Working set per sorted score element: value, index, relevance, cumulative hits, group ends.
_BYTES_PER_RANKED_ELEMENT = 40
DEFAULT_MEMORY_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class PerQueryRanking:
    """Per-query results of ranking one block (or all) of the queries, as numpy arrays.

    ``first_hit`` is the 0-based position of the first positive (−1 without positives);
    ``average_precision`` is step AP over the whole ranking (NaN without positives, or when it was
    not asked for); ``ap_at_k`` is the truncated AP@k (0 without positives, NaN if not asked for);
    ``num_positives`` counts the positives each query can retrieve.
    """

    first_hit: np.ndarray
    average_precision: np.ndarray
    ap_at_k: np.ndarray
    num_positives: np.ndarray

    @staticmethod
    def concatenate(parts: Sequence[PerQueryRanking]) -> PerQueryRanking:
        if not parts:
            empty_f = np.empty(0, dtype=np.float64)
            return PerQueryRanking(
                np.empty(0, dtype=np.int64), empty_f, empty_f, np.empty(0, dtype=np.int64)
            )
        return PerQueryRanking(
            np.concatenate([p.first_hit for p in parts]),
            np.concatenate([p.average_precision for p in parts]),
            np.concatenate([p.ap_at_k for p in parts]),
            np.concatenate([p.num_positives for p in parts]),
        )

    def correct_at(self, k: int) -> np.ndarray:
        """Boolean per query: a positive lies within the first ``k`` results."""
        return (self.first_hit >= 0) & (self.first_hit < k)


def check_rule(rule: str, allowed: Sequence[str], what: str) -> None:
    if rule not in allowed:
        raise UserError(
            f"{what}: unknown rule {rule!r} for queries without positives",
            hint=f"use one of: {', '.join(allowed)}",
        )


def query_block_size(gallery_size: int, memory_bytes: int = DEFAULT_MEMORY_BYTES) -> int:
    """How many query rows to rank at once so the working set stays near ``memory_bytes``."""
    return max(1, int(memory_bytes // (max(gallery_size, 1) * _BYTES_PER_RANKED_ELEMENT)))


def rank_block(
    scores: torch.Tensor,
    query_labels: torch.Tensor,
    gallery_labels: torch.Tensor,
    self_index: torch.Tensor | None = None,
    *,
    full_ap: bool = True,
    ap_k: int | None = None,
) -> PerQueryRanking:
    """Rank one block of queries against the whole gallery and score the ranking.

    ``scores`` (b, n): higher = closer. ``self_index`` (b,): gallery row of each query's own item
    (leave-one-out) or None. All tensors must live on one device; the results come back as numpy.
    """
    if scores.ndim != 2:
        raise UserError(f"scores must be 2-D (queries, gallery), got shape {tuple(scores.shape)}")
    b, n = scores.shape
    if self_index is not None:
        # −inf puts the query's own item last, after every finite score; it is then masked out of
        # relevance, so it never counts as a result or as a threshold before any positive.
        scores = scores.clone()
        scores[torch.arange(b, device=scores.device), self_index] = float("-inf")
    sorted_scores, order = torch.sort(scores, dim=1, descending=True, stable=True)
    relevant = gallery_labels[order] == query_labels[:, None]
    if self_index is not None:
        relevant &= order != self_index[:, None]
    num_positives = relevant.sum(dim=1)
    has_positive = num_positives > 0
    first_hit = torch.where(has_positive, relevant.to(torch.uint8).argmax(dim=1), -1)

    hits_so_far = relevant.cumsum(dim=1, dtype=torch.int64) if (full_ap or ap_k) else None
    positions = torch.arange(1, n + 1, device=scores.device, dtype=torch.float64)

    average_precision = torch.full((b,), float("nan"), dtype=torch.float64, device=scores.device)
    if full_ap and n:
        assert hits_so_far is not None
        tie_with_next = sorted_scores[:, 1:] == sorted_scores[:, :-1]
        if bool(tie_with_next.any()):
            # Precision of a positive is read at the end of its group of tied
            # scores (one threshold).
            group_end = torch.arange(n, device=scores.device).expand(b, n).clone()
            group_end[:, :-1][tie_with_next] = n
            group_end = group_end.flip(1).cummin(dim=1).values.flip(1)
            precision = hits_so_far.gather(1, group_end).to(torch.float64) / (group_end + 1).to(
                torch.float64
            )
        else:
            precision = hits_so_far.to(torch.float64) / positions
        summed = (precision * relevant).sum(dim=1)
        average_precision = torch.where(
            has_positive, summed / num_positives.clamp(min=1).to(torch.float64), average_precision
        )

    ap_at_k = torch.full((b,), float("nan"), dtype=torch.float64, device=scores.device)
    if ap_k:
        assert hits_so_far is not None
        k = min(ap_k, n)
        head_hits = relevant[:, :k]
        precision_k = hits_so_far[:, :k].to(torch.float64) / positions[:k]
        denominator = num_positives.clamp(max=ap_k).clamp(min=1).to(torch.float64)
        ap_at_k = torch.where(has_positive, (precision_k * head_hits).sum(dim=1) / denominator, 0.0)

    return PerQueryRanking(
        first_hit.cpu().numpy().astype(np.int64),
        average_precision.cpu().numpy(),
        ap_at_k.cpu().numpy(),
        num_positives.cpu().numpy().astype(np.int64),
    )


def _as_tensor(array: np.ndarray | torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    tensor = (
        array if isinstance(array, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(array))
    )
    return tensor if dtype is None else tensor.to(dtype)


def _validate(
    scores: np.ndarray | torch.Tensor,
    query_labels: np.ndarray,
    gallery_labels: np.ndarray,
    leave_one_out: bool,
) -> None:
    if scores.ndim != 2:
        raise UserError(f"scores must be 2-D (queries, gallery), got shape {tuple(scores.shape)}")
    queries, gallery = scores.shape
    label_vectors(query_labels, gallery_labels, queries, gallery, leave_one_out)
    finite = (
        torch.isfinite(_as_tensor(scores)).all()
        if isinstance(scores, torch.Tensor)
        else np.isfinite(scores).all()
    )
    if not bool(finite):
        raise UserError(
            "scores contain NaN or infinite values", hint="check the embeddings for NaN rows"
        )


def rank_queries(
    scores: np.ndarray | torch.Tensor,
    query_labels: np.ndarray,
    gallery_labels: np.ndarray,
    *,
    leave_one_out: bool = False,
    full_ap: bool = True,
    ap_k: int | None = None,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
) -> PerQueryRanking:
    """Per-query first-hit position, step AP and AP@k for a whole score matrix, in blocks."""
    _validate(scores, query_labels, gallery_labels, leave_one_out)
    nq, ng = scores.shape
    scores_t = _as_tensor(scores)
    device = scores_t.device
    q_labels = _as_tensor(np.asarray(query_labels), torch.int64).to(device)
    g_labels = _as_tensor(np.asarray(gallery_labels), torch.int64).to(device)
    block = query_block_size(ng, memory_bytes)
    blocks = []
    for start in range(0, nq, block):
        stop = min(start + block, nq)
        self_index = torch.arange(start, stop, device=device) if leave_one_out else None
        blocks.append(
            rank_block(
                scores_t[start:stop],
                q_labels[start:stop],
                g_labels,
                self_index,
                full_ap=full_ap,
                ap_k=ap_k,
            )
        )
    return PerQueryRanking.concatenate(blocks)


def cmc_from_ranking(
    ranking: PerQueryRanking,
    topk: Sequence[int] = (1, 5),
    no_positive: NoPositiveRule = "count-as-miss",
) -> dict[int, float]:
    """CMC top-k accuracies from per-query first-hit positions."""
    check_rule(no_positive, ("count-as-miss", "exclude"), "CMC")
    for k in topk:
        if int(k) < 1:
            raise UserError(f"top-k values must be ≥ 1, got {k}")
    keep = (
        ranking.num_positives > 0
        if no_positive == "exclude"
        else np.ones(len(ranking.first_hit), bool)
    )
    denominator = int(keep.sum())
    if denominator == 0:
        return {int(k): float("nan") for k in topk}
    return {int(k): float(ranking.correct_at(int(k))[keep].sum() / denominator) for k in topk}


def map_from_ranking(ranking: PerQueryRanking) -> float:
    """Mean step AP over the queries that have at least one positive (NaN if none has)."""
    values = ranking.average_precision[ranking.num_positives > 0]
    return float(values.mean()) if len(values) else float("nan")


def map_at_k_from_ranking(
    ranking: PerQueryRanking, no_positive: NoPositiveRule = "count-as-zero"
) -> float:
    check_rule(no_positive, ("count-as-zero", "exclude"), "mAP@k")
    values = (
        ranking.ap_at_k
        if no_positive == "count-as-zero"
        else ranking.ap_at_k[ranking.num_positives > 0]
    )
    return float(values.mean()) if len(values) else float("nan")


def cmc_topk(
    scores: np.ndarray | torch.Tensor,
    query_labels: np.ndarray,
    gallery_labels: np.ndarray,
    topk: Sequence[int] = (1, 5),
    *,
    leave_one_out: bool = False,
    no_positive: NoPositiveRule = "count-as-miss",
) -> dict[int, float]:
    """CMC top-k: fraction of queries with a positive among their ``k`` nearest gallery items.

    ``no_positive="count-as-miss"`` is FastFill's rule (all queries in the denominator),
    ``"exclude"`` the open-reid / ml-fct ``cmc`` rule.
    """
    ranking = rank_queries(
        scores, query_labels, gallery_labels, leave_one_out=leave_one_out, full_ap=False
    )
    return cmc_from_ranking(ranking, topk, no_positive)


def mean_average_precision(
    scores: np.ndarray | torch.Tensor,
    query_labels: np.ndarray,
    gallery_labels: np.ndarray,
    *,
    leave_one_out: bool = False,
) -> float:
    """mAP with step AP (scikit-learn's ``average_precision_score``) over the whole ranking.

    Queries without positives are excluded from the mean (ml-fct / open-reid ``mean_ap`` rule).
    """
    return map_from_ranking(
        rank_queries(scores, query_labels, gallery_labels, leave_one_out=leave_one_out)
    )


def leave_one_out_cmc(
    scores: np.ndarray | torch.Tensor,
    labels: np.ndarray,
    topk: Sequence[int] = (1, 5),
    no_positive: NoPositiveRule = "count-as-miss",
) -> dict[int, float]:
    """CMC with the query set = gallery set, each query's own row excluded."""
    return cmc_topk(scores, labels, labels, topk, leave_one_out=True, no_positive=no_positive)


def leave_one_out_map(scores: np.ndarray | torch.Tensor, labels: np.ndarray) -> float:
    """Step-AP mAP with the query set = gallery set, each query's own row excluded."""
    return mean_average_precision(scores, labels, labels, leave_one_out=True)


def truncated_average_precision(hits: np.ndarray, num_relevant: np.ndarray, k: int) -> np.ndarray:
    """AP@k per row: (1 / min(num_relevant, k)) Σ_{i ≤ k} P(i)·rel(i); 0 where num_relevant is 0.

    ``hits`` (nq, ≥k) boolean relevance of the ranked results, counted positions included.
    """
    hits = np.asarray(hits, dtype=bool)[:, :k]
    num_relevant = np.asarray(num_relevant, dtype=np.int64)
    precision = np.cumsum(hits, axis=1) / np.arange(1, hits.shape[1] + 1)
    summed = (precision * hits).sum(axis=1)
    denominator = np.minimum(num_relevant, k)
    return np.where(denominator > 0, summed / np.maximum(denominator, 1), 0.0)
