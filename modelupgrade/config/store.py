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
    # One of modelupgrade.store.STORE_POLICIES: random, ingest-order, old-confidence, old-entropy,
    # fastfill-uncertainty.
    policy: str = "old-confidence"
    # One of modelupgrade.store.SERVING_MODES: mixed, rank-merge.
    serving_mode: str = "mixed"
    distance: Literal["cosine", "l2"] = "cosine"
    top_k: int = Field(default=10, ge=1)
    embed_batch_size: int = Field(default=256, ge=1)
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=1, le=65535)
