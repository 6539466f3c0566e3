"""params.yaml: ``store`` section (the real gallery store, its backfill job and its service)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from modelupgrade.config.base import Section


class StoreIndexParams(Section):
    """``store.index``: how each embedding space of a new store is searched. ``flat`` scans every
    vector (exact); ``hnsw`` and ``ivf`` find candidates per part with an approximate index (FAISS
    in the embedded store, Milvus's own index in Milvus), which the store ranks exactly with the
    shared kernel. Like the backend, a store keeps the index it was created with."""

    kind: Literal["flat", "hnsw", "ivf"] = "flat"
    # HNSW: graph degree, build-time and search-time candidate lists (Milvus's M, efConstruction,
    # ef); a search's list is at least the candidates it asks for.
    hnsw_m: int = Field(default=16, ge=2, le=2048)
    hnsw_ef_construction: int = Field(default=200, ge=1)
    hnsw_ef_search: int = Field(default=128, ge=1)
    # IVF (IVF_FLAT in Milvus): k-means cells, and cells scanned per query.
    ivf_nlist: int = Field(default=1024, ge=1, le=65536)
    ivf_nprobe: int = Field(default=32, ge=1)

    @model_validator(mode="after")
    def _nprobe_within_nlist(self) -> StoreIndexParams:
        if self.ivf_nprobe > self.ivf_nlist:
            raise ValueError(
                f"ivf_nprobe ({self.ivf_nprobe}) exceeds ivf_nlist ({self.ivf_nlist}): a query "
                "cannot scan more cells than there are"
            )
        return self


class StoreParams(Section):
    path: str = "stores/demo"
    # Where a new store keeps its vectors: a backend of modelupgrade.store.backends.VECTOR_BACKENDS
    # (embedded, milvus); checked by modelupgrade.params. A store keeps the backend it was created
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
    # old-entropy, fastfill-uncertainty); checked by modelupgrade.params.
    policy: str = "old-confidence"
    # A mode of modelupgrade.serving.SERVING_MODES; checked by modelupgrade.params.
    serving_mode: str = "mixed"
    distance: Literal["cosine", "l2"] = "cosine"
    index: StoreIndexParams = Field(default_factory=StoreIndexParams)
    top_k: int = Field(default=10, ge=1)
    embed_batch_size: int = Field(default=256, ge=1)
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=1, le=65535)
    # What one POST /search may ask of the service: query vectors per request, hits per query.
    max_query_vectors: int = Field(default=64, ge=1)
    max_k: int = Field(default=1000, ge=1)
    # The service's limits before a body is parsed: its size, the time it may take to arrive,
    # requests handled at once; and the largest value a query vector may hold.
    max_request_bytes: int = Field(default=4 << 20, ge=1024)
    request_timeout_s: float = Field(default=10.0, gt=0)
    max_connections: int = Field(default=64, ge=1)
    max_query_magnitude: float = Field(default=1e6, gt=0)
    # Serve the OpenAPI schema at /openapi.json (behind the token); there are no HTML docs.
    service_openapi: bool = False
    # Hours after a cutover during which the old space's vectors are kept for a rollback;
    # `modelupgrade cleanup` drops them only after (or with --force and a reason).
    rollback_window_hours: float = Field(default=168.0, ge=0)

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
