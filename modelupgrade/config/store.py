"""params.yaml: ``store`` section (the real gallery store, its backfill job and its service)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from modelupgrade.config.base import Section


class StoreParams(Section):
    path: str = "stores/demo"
    # Where a new store keeps its vectors: a backend of modelupgrade.store.backends.VECTOR_BACKENDS
    # (embedded, milvus); checked by modelupgrade.plugins. A store keeps the backend it was created
    # with; its items, scores and backfill ledger stay in its SQLite database either way.
    backend: str = "embedded"
    # The milvus backend's address: a Milvus Lite file (a path ending in .db), a server URI
    # (http://host:19530), or empty for a Milvus Lite file inside the store. A server's token is
    # read from the MILVUS_TOKEN environment variable, never from this file.
    uri: str = ""
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
    # What one POST /search may ask of the service: query vectors per request, hits per query.
    max_query_vectors: int = Field(default=64, ge=1)
    max_k: int = Field(default=1000, ge=1)

    @model_validator(mode="after")
    def _top_k_within_max_k(self) -> StoreParams:
        if self.top_k > self.max_k:
            raise ValueError(f"top_k ({self.top_k}) exceeds max_k ({self.max_k})")
        return self

    @model_validator(mode="after")
    def _uri_only_for_milvus(self) -> StoreParams:
        if self.uri and self.backend == "embedded":
            raise ValueError(
                f"store.uri ({self.uri!r}) is the milvus backend's address; the embedded backend "
                "keeps its vectors in the store directory (set store.backend: milvus, or drop uri)"
            )
        return self
