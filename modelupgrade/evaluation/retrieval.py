"""Evaluate one (query embeddings, gallery embeddings) pair under the configured protocol.

Top-k metrics (CMC, GLDv2-style mAP@k, per-query correctness for negative flips) come from the
FAISS searcher for cosine similarity, and from the exact blocked ranking otherwise; mAP over the
whole ranking always comes from the exact blocked ranking (``modelupgrade.metrics.rank_features``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from modelupgrade.config.evaluation import EvaluationParams
from modelupgrade.errors import UserError
from modelupgrade.metrics import (
    PerQueryRanking,
    cmc_from_ranking,
    map_at_k_from_ranking,
    map_from_ranking,
    rank_features,
    truncated_average_precision,
)
from modelupgrade.retrieval.index import GallerySearcher, SearchOptions, exclude_self


@dataclass
class PairResult:
    metrics: dict[str, float]
    # Per query: a positive within the first ``flip_k`` results (negative-flip bookkeeping).
    correct: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)


class RetrievalEvaluator:
    """Scores query/gallery embedding pairs against fixed labels under one protocol."""

    def __init__(
        self,
        params: EvaluationParams,
        query_labels: np.ndarray,
        gallery_labels: np.ndarray,
        leave_one_out: bool,
        device: torch.device | str = "cpu",
    ) -> None:
        self.params = params
        self.query_labels = np.asarray(query_labels, dtype=np.int64)
        self.gallery_labels = np.asarray(gallery_labels, dtype=np.int64)
        self.leave_one_out = leave_one_out
        self.device = torch.device(device)
        if leave_one_out and not np.array_equal(self.query_labels, self.gallery_labels):
            raise UserError("leave-one-out needs identical query and gallery labels")
        counts = np.bincount(
            self.gallery_labels,
            minlength=int(max(self.query_labels.max(initial=0), self.gallery_labels.max(initial=0)))
            + 1,
        )
        self.num_positives = counts[self.query_labels] - (1 if leave_one_out else 0)
        self.search_options = SearchOptions.from_params(params.search)
        self.max_k = max([*params.topk, params.flip_k, params.map_at_k or 0])

    def protocol_description(self) -> dict[str, Any]:
        p = self.params
        return {
            "protocol": "leave-one-out" if self.leave_one_out else "query-gallery",
            "similarity": p.similarity,
            "cmc": f"CMC top-k, queries without positives: {p.cmc_no_positive}",
            "mAP": (
                "step AP (sklearn average_precision_score) over the whole ranking; queries "
                "without positives excluded"
                if p.full_map
                else None
            ),
            "mAP@k": f"GLDv2 AP@{p.map_at_k} over all queries" if p.map_at_k else None,
            "num_queries": len(self.query_labels),
            "num_gallery": len(self.gallery_labels),
        }

    def _topk_from_search(
        self, query: np.ndarray, gallery: np.ndarray
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Gallery ids of the ``max_k`` best results per query (self excluded
        under leave-one-out)."""
        searcher = GallerySearcher(gallery, self.search_options)
        k = min(self.max_k + (1 if self.leave_one_out else 0), len(gallery))
        scores, ids = searcher.search(query, k)
        if self.leave_one_out:
            ids, scores = exclude_self(ids, scores, np.arange(len(query)), k - 1)
        return ids, searcher.describe()

    def _ranking_from_ids(self, ids: np.ndarray) -> PerQueryRanking:
        hits = (ids >= 0) & (self.gallery_labels[np.maximum(ids, 0)] == self.query_labels[:, None])
        first = np.where(hits.any(axis=1), hits.argmax(axis=1), -1)
        ap_k = (
            truncated_average_precision(hits, self.num_positives, self.params.map_at_k)
            if self.params.map_at_k
            else np.full(len(ids), np.nan)
        )
        return PerQueryRanking(
            first.astype(np.int64), np.full(len(ids), np.nan), ap_k, self.num_positives
        )

    def evaluate(self, query: np.ndarray, gallery: np.ndarray) -> PairResult:
        p = self.params
        if len(query) != len(self.query_labels) or len(gallery) != len(self.gallery_labels):
            raise UserError(
                f"{len(query)} query and {len(gallery)} gallery vectors for "
                f"{len(self.query_labels)} query and {len(self.gallery_labels)} gallery labels",
                hint="embeddings must be computed on the split files, row for row",
            )
        info: dict[str, Any] = {}
        full: PerQueryRanking | None = None
        if p.full_map or p.similarity != "cosine":
            full = rank_features(
                query,
                gallery,
                self.query_labels,
                self.gallery_labels,
                similarity=p.similarity,
                leave_one_out=self.leave_one_out,
                full_ap=p.full_map,
                ap_k=p.map_at_k if p.similarity != "cosine" else None,
                memory_bytes=p.ranking_memory_mb * 1024 * 1024,
                device=self.device,
            )
        if p.similarity == "cosine":
            ids, info["search"] = self._topk_from_search(query, gallery)
            topk_ranking = self._ranking_from_ids(ids)
        else:
            assert full is not None
            topk_ranking, info["search"] = full, {"index": "exact blocked ranking", "exact": True}
        metrics: dict[str, float] = {
            f"top{k}": v
            for k, v in cmc_from_ranking(topk_ranking, p.topk, p.cmc_no_positive).items()
        }
        if p.full_map and full is not None:
            metrics["mAP"] = map_from_ranking(full)
        if p.map_at_k:
            metrics[f"mAP@{p.map_at_k}"] = map_at_k_from_ranking(topk_ranking, "count-as-zero")
        return PairResult(metrics, topk_ranking.correct_at(p.flip_k), info)
