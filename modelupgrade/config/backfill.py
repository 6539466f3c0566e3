"""params.yaml: ``backfill`` section (online-backfilling simulator: policies,
serving modes, points)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from modelupgrade.config.base import Section


class BackfillParams(Section):
    # Names in modelupgrade.ordering.ORDERINGS / modelupgrade.serving.SERVING_MODES (checked by
    # modelupgrade.params); combinations lacking inputs are skipped.
    policies: list[str] = Field(
        default_factory=lambda: [
            "random",
            "old-confidence",
            "old-entropy",
            "fastfill-uncertainty",
            "oracle",
        ]
    )
    serving_modes: list[str] = Field(
        default_factory=lambda: ["mixed", "rank-merge", "rank-merge-rqt", "rank-merge-full"]
    )
    # uniform: `points` points t_i = i/(points-1) (Seo et al.: 11); fastfill: B + 2 points,
    # B = fastfill_steps.
    grid: Literal["uniform", "fastfill"] = "uniform"
    points: int = Field(default=11, ge=2)
    fastfill_steps: int = Field(default=20, ge=0)
    # Seo et al. use cosine; FastFill uses l2 on raw features.
    distance: Literal["l2", "cosine"] = "cosine"
    # A policy whose order is a draw from the seed (random) is studied as the mean curve of this
    # many permutations, seeds seed, seed + 1, … (FastFill averages 5).
    random_permutations: int = Field(default=5, ge=1)
    topk: list[int] = Field(default_factory=lambda: [1, 5])
    map_at_k: int | None = Field(default=None, ge=1)
    # AUC reported both ways; `primary_auc` is the one plots and the summary headline use.
    primary_auc: Literal["auc_mean", "auc_trapezoid"] = "auc_trapezoid"
    # Query rows per block are sized to this working-set budget (bounded memory).
    memory_mb: int = Field(default=384, ge=16)

    @model_validator(mode="after")
    def _topk_counts_top1(self) -> BackfillParams:
        if 1 not in self.topk or min(self.topk) < 1:
            raise ValueError(
                "backfill.topk must contain 1 (negative flips are counted at top-1) and be ≥ 1"
            )
        return self
