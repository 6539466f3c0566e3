"""params.yaml: ``backfill`` section (simulator policies, serving modes, curve points)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from modelupgrade.config.base import Section


class BackfillParams(Section):
    policies: list[str] = Field(default_factory=lambda: ["random", "old-confidence", "old-entropy", "fastfill-uncertainty", "oracle"])
    serving_modes: list[str] = Field(default_factory=lambda: ["mixed", "rank-merge", "rank-merge-rqt", "rank-merge-full"])
    points: int = Field(default=11, ge=2)
    grid: Literal["uniform", "fastfill"] = "uniform"
    distance: Literal["l2", "cosine"] = "l2"
