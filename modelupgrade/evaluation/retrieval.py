"""Evaluate one (query embeddings, gallery embeddings) pair under the configured protocol.

What scores each query is decided once, by ``EvaluationGroundTruth``
(``modelupgrade.evaluation.revisited``): queries of a Revisited Oxford/Paris set are ranked against
their set's own gallery and scored under Easy/Medium/Hard (``<set>/<protocol>/mAP``, ``mP@k``); the
other queries (all of them for Fashion-MNIST and every dataset without revisited sets) by label.

Label-based top-k metrics (CMC, GLDv2-style mAP@k, per-query correctness for negative flips) come
from the FAISS searcher for cosine similarity, and from the exact blocked ranking otherwise; mAP
over the whole ranking always comes from the exact blocked ranking
(``modelupgrade.metrics.rank_features``). With ``evaluation.tar_at_far``, the label-scored part is
also scored as 1:1 verification (``TAR@FAR=1e-03``): every (query, gallery item) pair is a trial.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    import pandas as pd

from modelupgrade.config.evaluation import EvaluationParams
from modelupgrade.errors import UserError
from modelupgrade.evaluation.revisited import EvaluationGroundTruth, rows_of
from modelupgrade.json_data import JsonObject
from modelupgrade.metrics import (
    PerQueryRanking,
    TarAtFarAccumulator,
    cmc_from_ranking,
    map_at_k_from_ranking,
    map_from_ranking,
    rank_features,
    truncated_average_precision,
)
from modelupgrade.metrics.ranking import query_block_size
from modelupgrade.retrieval.distance import as_feature_tensor, prepare, score_block
from modelupgrade.retrieval.index import GallerySearcher, SearchOptions, exclude_self
from modelupgrade.retrieval.protocol import read_split_frames, resolve_protocol


def tar_at_far_metric_name(far: float) -> str:
    """``TAR@FAR=1e-03``: the shortest scientific notation that still tells every float apart."""
    return f"TAR@FAR={np.format_float_scientific(far, unique=True, trim='-', exp_digits=2)}"


@dataclass
class PairResult:
    metrics: dict[str, float]
    # Per query: a positive within the first ``flip_k`` results (negative-flip bookkeeping).
    correct: np.ndarray
    info: JsonObject = field(default_factory=dict)
    # Per query: its step AP, whose mean over the queries with a positive is mAP (NaN for a query
    # without positives or not scored by label); None where mAP is not computed.
    average_precision: np.ndarray | None = None


class RetrievalEvaluator:
    """Scores query/gallery embedding pairs against fixed ground truth under one protocol.

    ``query_labels`` and ``gallery_labels`` cover every row of the splits; ``ground_truth`` says
    which rows are scored by label (by default all of them) and which by a revisited set's
    protocol. ``from_split_files`` reads both from the split files.
    """

    def __init__(
        self,
        params: EvaluationParams,
        query_labels: np.ndarray,
        gallery_labels: np.ndarray,
        leave_one_out: bool,
        device: torch.device | str = "cpu",
        *,
        ground_truth: EvaluationGroundTruth | None = None,
    ) -> None:
        self.params = params
        query_labels = np.asarray(query_labels, dtype=np.int64)
        gallery_labels = np.asarray(gallery_labels, dtype=np.int64)
        self.num_queries, self.num_gallery = len(query_labels), len(gallery_labels)
        self.ground_truth = ground_truth or EvaluationGroundTruth()
        if leave_one_out and self.ground_truth.revisited:
            raise UserError("revisited sets are scored with disjoint queries and gallery")
        # The label-scored part: every row unless some belong to a revisited set.
        self.label_queries = self.ground_truth.label_queries
        self.label_gallery = self.ground_truth.label_gallery
        self.query_labels = query_labels[self.label_queries]
        self.gallery_labels = gallery_labels[self.label_gallery]
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

    @classmethod
    def from_split_files(
        cls,
        params: EvaluationParams,
        query_split: str | Path,
        gallery_split: str | Path,
        device: torch.device | str = "cpu",
    ) -> RetrievalEvaluator:
        """The evaluator of a scenario's split files: their labels, the protocol they resolve to
        (``evaluation.protocol``) and the ground truth their rows carry."""
        query, gallery, leave_one_out = read_split_frames(
            params.protocol, query_split, gallery_split
        )
        return cls.from_frames(params, query, gallery, device, leave_one_out)

    @classmethod
    def from_frames(
        cls,
        params: EvaluationParams,
        query: pd.DataFrame,
        gallery: pd.DataFrame,
        device: torch.device | str = "cpu",
        leave_one_out: bool | None = None,
    ) -> RetrievalEvaluator:
        """The evaluator of query and gallery rows (split files or tables as read): their
        labels, the protocol they resolve to (``evaluation.protocol``, unless ``leave_one_out``
        is given) and the ground truth their rows carry."""
        if leave_one_out is None:
            leave_one_out = resolve_protocol(
                params.protocol, query.item_id.to_numpy(), gallery.item_id.to_numpy()
            )
        return cls(
            params,
            query.label.to_numpy(np.int64),
            gallery.label.to_numpy(np.int64),
            leave_one_out,
            device,
            ground_truth=EvaluationGroundTruth.from_splits(query, gallery, leave_one_out),
        )

    @property
    def scores_labels(self) -> bool:
        """Whether some queries are scored by label (all of them without revisited sets)."""
        return rows_of(self.label_queries, self.num_queries) > 0

    def metric_names(self) -> list[str]:
        """The metrics ``evaluate`` returns (besides the per-query correctness)."""
        p = self.params
        label = [
            *(f"top{k}" for k in p.topk),
            *(["mAP"] if p.full_map else []),
            *([f"mAP@{p.map_at_k}"] if p.map_at_k else []),
            *(tar_at_far_metric_name(far) for far in p.tar_at_far),
        ]
        return [*(label if self.scores_labels else []), *self.ground_truth.metric_names()]

    def require_metric(self, metric: str, setting: str) -> None:
        """Refuse a ``setting`` (e.g. evaluation.headline_metric) naming a metric not computed."""
        names = self.metric_names()
        if metric not in names:
            raise UserError(
                f"{setting} is {metric!r}, which this evaluation does not compute",
                hint=f"pick one of: {', '.join(names)}",
            )

    def protocol_description(self) -> JsonObject:
        p = self.params
        revisited = self.ground_truth.describe()
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
            "TAR@FAR": (
                "1:1 verification, IJB-C nearest-ROC-point rule (insightface ijb_11); every "
                "label-scored (query, gallery item) pair is a trial, genuine when labels are equal"
                + ("; a query's own row excluded" if self.leave_one_out else "")
                if p.tar_at_far
                else None
            ),
            "num_queries": self.num_queries,
            "num_gallery": self.num_gallery,
            **({"revisited": revisited} if revisited else {}),
        }

    def _topk_from_search(
        self, query: np.ndarray, gallery: np.ndarray
    ) -> tuple[np.ndarray, JsonObject]:
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
        if len(query) != self.num_queries or len(gallery) != self.num_gallery:
            raise UserError(
                f"{len(query)} query and {len(gallery)} gallery vectors for "
                f"{self.num_queries} query and {self.num_gallery} gallery labels",
                hint="embeddings must be computed on the split files, row for row",
            )
        metrics: dict[str, float] = {}
        correct = np.zeros(len(query), dtype=bool)
        info: JsonObject = {}
        average_precision = None
        if self.scores_labels:
            labelled = self._evaluate_labels(query[self.label_queries], gallery[self.label_gallery])
            metrics.update(labelled.metrics)
            correct[self.label_queries] = labelled.correct
            info.update(labelled.info)
            if labelled.average_precision is not None:
                average_precision = np.full(len(query), np.nan)
                average_precision[self.label_queries] = labelled.average_precision
        for revisited in self.ground_truth.revisited:
            scores, right = revisited.score(
                query,
                gallery,
                similarity=p.similarity,
                flip_k=p.flip_k,
                memory_bytes=p.ranking_memory_mb * 1024 * 1024,
                device=self.device,
            )
            metrics.update(scores)
            correct[revisited.query_rows] = right
            info.setdefault("search", {"index": "exact full ranking per revisited set"})
        return PairResult(metrics, correct, info, average_precision)

    def _evaluate_labels(self, query: np.ndarray, gallery: np.ndarray) -> PairResult:
        """The label-scored queries against the label-scored gallery."""
        p = self.params
        info: JsonObject = {}
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
        if p.tar_at_far:
            tars = self._tar_at_far(query, gallery)
            metrics.update(
                {tar_at_far_metric_name(far): float(t) for far, t in zip(p.tar_at_far, tars)}
            )
        return PairResult(
            metrics,
            topk_ranking.correct_at(p.flip_k),
            info,
            None if full is None or not p.full_map else full.average_precision,
        )

    def _tar_at_far(self, query: np.ndarray, gallery: np.ndarray) -> np.ndarray:
        """TAR at each ``evaluation.tar_at_far`` of the label-scored queries against the
        label-scored gallery, every (query, gallery item) pair one trial.

        Only the label-scored part takes part: a revisited set's (ROxford/RParis) rows have no
        identity labels, only per-query easy/hard/junk lists, so their pairs are no verification
        trials. Under leave-one-out a query's pair with its own row is no trial, as in the ranking.
        Scores come block by block and only the high-scoring trials are kept
        (``TarAtFarAccumulator``), so the score matrix never exists whole.
        """
        p = self.params
        q = prepare(as_feature_tensor(query, "query features"), p.similarity)
        g = prepare(as_feature_tensor(gallery, "gallery features"), p.similarity).to(self.device)
        num_genuine = int(self.num_positives.sum())
        num_trials = len(q) * len(g) - (len(q) if self.leave_one_out else 0)
        accumulator = TarAtFarAccumulator(p.tar_at_far, num_trials - num_genuine)
        block = query_block_size(len(g), p.ranking_memory_mb * 1024 * 1024)
        for start in range(0, len(q), block):
            stop = min(start + block, len(q))
            scores = score_block(q[start:stop].to(self.device), g, p.similarity).cpu().numpy()
            genuine = self.query_labels[start:stop, None] == self.gallery_labels[None, :]
            impostor = ~genuine
            if self.leave_one_out:
                # A query's own row carries its label, so dropping it from the genuine trials
                # removes it from the trials altogether.
                genuine[np.arange(stop - start), np.arange(start, stop)] = False
            accumulator.add(scores[genuine], scores[impostor])
        return accumulator.result()
