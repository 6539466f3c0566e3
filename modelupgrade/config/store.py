"""params.yaml: ``store`` section (the real gallery store, its backfill job and its service)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from modelupgrade.config.base import Section


class StoreParams(Section):
    path: str = "stores/demo"
    # Items per atomic commit: larger chunks amortise the fsync + transaction, smaller ones lose
    # less work to a crash and let SIGTERM stop sooner.
    chunk_size: int = Field(default=512, ge=1)
    # A deployable policy of modelupgrade.ordering.ORDERINGS (random, ingest-order, old-confidence,
    # old-entropy, fastfill-uncertainty); checked by modelupgrade.plugins.
    policy: str = "old-confidence"
    # A mode of modelupgrade.serving.SERVING_MODES; checked by modelupgrade.plugins.
    serving_mode: str = "mixed"
    distance: Literal["cosine", "l2"] = "cosine"
    top_k: int = Field(default=10, ge=1)
    embed_batch_size: int = Field(default=256, ge=1)
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=1, le=65535)
