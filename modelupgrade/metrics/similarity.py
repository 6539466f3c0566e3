"""The blocked ranking of feature matrices (scores from ``modelupgrade.retrieval.distance``)."""

from __future__ import annotations

import numpy as np
import torch

from modelupgrade.arrays import label_vectors
from modelupgrade.errors import UserError
from modelupgrade.metrics.ranking import (
    DEFAULT_MEMORY_BYTES,
    PerQueryRanking,
    query_block_size,
    rank_block,
)
from modelupgrade.retrieval.distance import Similarity, as_feature_tensor, prepare, score_block


def pairwise_scores(
    query: np.ndarray | torch.Tensor,
    gallery: np.ndarray | torch.Tensor,
    similarity: Similarity = "cosine",
) -> np.ndarray:
    """The full (queries × gallery) score matrix; small inputs only (it is materialised)."""
    q = prepare(as_feature_tensor(query, "query features"), similarity)
    g = prepare(as_feature_tensor(gallery, "gallery features"), similarity)
    _check_dims(q, g)
    return score_block(q, g, similarity).numpy()


def _check_dims(q: torch.Tensor, g: torch.Tensor) -> None:
    if q.shape[1] != g.shape[1]:
        raise UserError(
            f"query features are {q.shape[1]}-d but gallery features are {g.shape[1]}-d",
            hint="compare embeddings of the same space (apply the transformation head first)",
        )


def rank_features(
    query: np.ndarray | torch.Tensor,
    gallery: np.ndarray | torch.Tensor,
    query_labels: np.ndarray,
    gallery_labels: np.ndarray,
    *,
    similarity: Similarity = "cosine",
    leave_one_out: bool = False,
    full_ap: bool = True,
    ap_k: int | None = None,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> PerQueryRanking:
    """Rank every query against the whole gallery, block by block; the score matrix
    never exists whole.

    Memory stays near ``memory_bytes`` (query block × gallery) plus the two feature matrices.
    ``dtype`` defaults to float32 (float64 inputs stay float64).
    """
    device = torch.device(device)
    q = prepare(as_feature_tensor(query, "query features", dtype), similarity)
    g = prepare(as_feature_tensor(gallery, "gallery features", dtype), similarity).to(device)
    _check_dims(q, g)
    nq, ng = len(q), len(g)
    query_labels, gallery_labels = label_vectors(
        query_labels, gallery_labels, nq, ng, leave_one_out
    )
    q_labels = torch.as_tensor(np.array(query_labels, dtype=np.int64), device=device)
    g_labels = torch.as_tensor(np.array(gallery_labels, dtype=np.int64), device=device)
    block = query_block_size(ng, memory_bytes)
    blocks = []
    for start in range(0, nq, block):
        stop = min(start + block, nq)
        scores = score_block(q[start:stop].to(device), g, similarity)
        self_index = torch.arange(start, stop, device=device) if leave_one_out else None
        blocks.append(
            rank_block(
                scores, q_labels[start:stop], g_labels, self_index, full_ap=full_ap, ap_k=ap_k
            )
        )
    return PerQueryRanking.concatenate(blocks)
