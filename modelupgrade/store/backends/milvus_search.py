"""Search inside Milvus: a part of a snapshot searched by Milvus itself, and each index kind's
build and search parameters (``store.index``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.retrieval.distance import Distance
from modelupgrade.store.backends.base import PartGallery
from modelupgrade.store.spaces import SpaceSpec

if TYPE_CHECKING:
    from modelupgrade.config.store import StoreIndexParams

INDEX_TYPES: dict[str, str] = {"flat": "FLAT", "hnsw": "HNSW", "ivf": "IVF_FLAT"}
# Milvus's most results per query.
MAX_TOPK = 16384


class MilvusSearch(Protocol):
    """What a searched part asks of the Milvus backend (``MilvusVectors``)."""

    def search(
        self, spec: SpaceSpec, queries: np.ndarray, limit: int, distance: Distance, filter: str
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def read(self, spec: SpaceSpec, slots: np.ndarray) -> np.ndarray: ...


class SearchedPart(PartGallery):
    """A part searched by Milvus itself, its rows picked by the part's filter
    (``snapshots.part_filter``: the state each row records against a few ledger facts, of a size
    that does not grow with the gallery)."""

    def __init__(self, backend: MilvusSearch, spec: SpaceSpec, slots: np.ndarray, rows: str):
        self.backend, self.spec, self.slots, self.filter = backend, spec, slots, rows

    def candidates(
        self, queries: np.ndarray, limit: int, distance: Distance
    ) -> tuple[np.ndarray, np.ndarray]:
        if limit > MAX_TOPK:
            raise UserError(
                f"{limit} candidates a query are more than Milvus returns",
                hint=f"ask for k ≤ {MAX_TOPK // 2}",
            )
        return self.backend.search(self.spec, queries, limit, distance, self.filter)

    def vectors(self, slots: np.ndarray) -> np.ndarray:
        return self.backend.read(self.spec, slots)


def build_params(index: StoreIndexParams) -> dict[str, int]:
    """The index's build parameters, as Milvus names them."""
    if index.kind == "hnsw":
        return {"M": index.hnsw_m, "efConstruction": index.hnsw_ef_construction}
    if index.kind == "ivf":
        return {"nlist": index.ivf_nlist}
    return {}


def search_params(index: StoreIndexParams, limit: int) -> dict[str, int]:
    """The index's search parameters for ``limit`` candidates per query."""
    if index.kind == "hnsw":
        # HNSW's candidate list must hold every candidate asked for
        return {"ef": max(index.hnsw_ef_search, limit)}
    if index.kind == "ivf":
        return {"nprobe": index.ivf_nprobe}
    return {}
