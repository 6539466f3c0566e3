"""params.yaml: ``evaluation`` section."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from modelupgrade.config.base import Section


class EvaluationParams(Section):
    protocol: Literal["query-gallery", "leave-one-out"] = "query-gallery"
    topk: list[int] = Field(default_factory=lambda: [1, 5])
    map_at_k: int | None = Field(default=None, ge=1)
    index: Literal["flat", "ivf", "hnsw"] = "flat"
    query_block: int = Field(default=4096, ge=1)
    gallery_block: int = Field(default=65536, ge=1)
