"""params.yaml: ``evaluation`` section (retrieval protocol, search index, cross-model matrix)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from modelupgrade.config.base import Section


class SearchParams(Section):
    """Top-k search: FAISS exact inner product on normalised vectors unless an
    ANN index is chosen."""

    # A registered search index (``modelupgrade.retrieval.INDEXES``; plugins checks it).
    index: str = "flat"
    use_gpu: Literal["auto", "never", "always"] = "auto"
    query_block: int = Field(default=4096, ge=1)
    # A gallery above this many rows is split into shards whose top-k lists are merged.
    gallery_block: int = Field(default=1_000_000, ge=1)
    ivf_nlist: int = Field(default=1024, ge=1)
    ivf_nprobe: int = Field(default=32, ge=1)
    hnsw_m: int = Field(default=32, ge=2)
    hnsw_ef_construction: int = Field(default=200, ge=1)
    hnsw_ef_search: int = Field(default=128, ge=1)


class ConvergenceGateParams(Section):
    """The statistics a trained model must reach on its own training images for the claims
    resting on it to be tested (``modelupgrade.training.convergence``). Defaults: a model that
    left the loss plateau (the plateau ArcFace starts on sits at 2/3 of the first epoch's loss),
    retrieves its own data well, and whose classifier points where its embeddings are."""

    max_loss_ratio: float = Field(default=0.5, gt=0)
    min_prototype_accuracy: float = Field(default=0.8, ge=0, le=1)
    min_classifier_agreement: float = Field(default=0.9, ge=0, le=1)
    max_collapse: float = Field(default=0.9, ge=-1, le=1)
    # A head's alignment: the mean cosine of its output to the embedding it maps to, on its own
    # training pairs (``modelupgrade.heads.alignment``).
    min_head_alignment: float = Field(default=0.7, ge=-1, le=1)
    # A head trained through a classifier or a batch metric: the most its last tenth of epochs may
    # still move its loss, as a fraction of its whole descent.
    max_late_change: float = Field(default=0.05, gt=0)


class EvaluationParams(Section):
    # query-gallery: disjoint query and gallery splits; leave-one-out: the gallery split is also
    # the query set, each query's own row excluded (FastFill / ml-fct protocol); auto: leave-one-out
    # when the query and gallery split files list the same items in the same order,
    # else query-gallery.
    protocol: Literal["auto", "query-gallery", "leave-one-out"] = "auto"
    # Ranking score: cosine on L2-normalised embeddings (the papers' retrieval); euclidean on raw
    # features reproduces ml-fct/FastFill.
    similarity: Literal["cosine", "inner", "euclidean"] = "cosine"
    topk: list[int] = Field(default_factory=lambda: [1, 5])
    # Step-AP mAP over the whole ranking (exact, blocked); off leaves only top-k metrics.
    full_map: bool = True
    # GLDv2-style truncated mAP@k (all queries, AP 0 without hits); null = not computed.
    map_at_k: int | None = Field(default=None, ge=1)
    # Queries whose label has no gallery item: FastFill counts them as misses in CMC.
    cmc_no_positive: Literal["count-as-miss", "exclude"] = "count-as-miss"
    # Working memory of one block of ranked queries (scores, order, relevance, cumulative hits).
    ranking_memory_mb: int = Field(default=512, ge=16)
    search: SearchParams = Field(default_factory=SearchParams)
    # The strategy whose new model is the DMU "oracle" of Δ↓ (no compatibility loss).
    oracle_strategy: str = "independent"
    # Metric behind Δ↑ / Δ↓ in the summary, and the per-query correctness behind negative flips.
    headline_metric: str = "mAP"
    flip_k: int = Field(default=1, ge=1)
    # Every dimension-compatible (query set, gallery set) pair, or only those the summary needs.
    all_pairs: bool = True
    heatmap_metrics: list[str] = Field(default_factory=lambda: ["mAP", "top1"])
    # 1:1 verification TAR at these FARs (IJB-C, as UniBCT/BCT report for faces): every
    # (query, gallery item) pair of the label-scored rows is a trial, genuine when the labels are
    # equal; reported as ``TAR@FAR=1e-03``. Empty = not computed.
    tar_at_far: list[float] = Field(default_factory=list)
    # What a model and a head must reach for a claim resting on it to be tested.
    convergence: ConvergenceGateParams = Field(default_factory=ConvergenceGateParams)

    @field_validator("tar_at_far")
    @classmethod
    def _fars_are_rates(cls, fars: list[float]) -> list[float]:
        outside = [far for far in fars if not 0.0 < far < 1.0]
        if outside:
            raise ValueError(
                f"every FAR must lie strictly between 0 and 1 (e.g. 0.001 for TAR@FAR=1e-03); "
                f"out of range: {outside}"
            )
        if len(set(fars)) != len(fars):
            raise ValueError(f"FARs are listed more than once: {fars}")
        return fars

    @model_validator(mode="after")
    def _consistent(self) -> EvaluationParams:
        if not self.topk or any(k < 1 for k in self.topk):
            raise ValueError("topk must list at least one k ≥ 1")
        if not self.full_map and self.headline_metric == "mAP":
            raise ValueError(
                "headline_metric is 'mAP' but full_map is false; enable full_map or pick top1/mAP@k"
            )
        return self
