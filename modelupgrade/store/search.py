"""Top-k search over the store at any moment, including while a backfill writes to it.

A search takes one snapshot of the item table (one read transaction: which space holds each item),
then reads each part's vectors from its space file. The backfill makes rows durable before it points
items at them and never rewrites a committed row, so the vectors read always belong to the snapshot.
Snapshots and part vectors are reused until the store's commit counter moves.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.store.gallery import GalleryStore, Snapshot
from modelupgrade.store.serving import GalleryPart, SearchHits, ServingMode
from modelupgrade.store.serving.base import Distance, check_queries


@dataclass
class _Cached:
    snapshot: Snapshot
    parts: list[GalleryPart]


class Searcher:
    def __init__(self, store: GalleryStore, mode: ServingMode, distance: Distance = "cosine") -> None:
        if distance not in ("cosine", "l2"):
            raise UserError(f"unknown distance {distance!r}", hint="choose 'cosine' or 'l2'")
        self.store, self.mode, self.distance = store, mode, distance
        self._cached: _Cached | None = None
        self._lock = threading.Lock()

    def _current(self) -> _Cached:
        with self._lock:
            if self._cached is not None and self._cached.snapshot.commit_counter == self.store.commit_counter():
                return self._cached
            snapshot = self.store.snapshot()
            spaces = self.store.spaces()
            parts = []
            for space_name, positions in sorted(snapshot.partitions().items()):
                slots = snapshot.slots[positions]
                vectors = self.store.read_vectors(space_name, slots)
                parts.append(GalleryPart(spaces[space_name], slots, snapshot.item_ids[positions],
                                         read=lambda v=vectors: v))
            self._cached = _Cached(snapshot, parts)
            return self._cached

    def search(self, queries: np.ndarray, k: int) -> SearchHits:
        if k < 1:
            raise UserError(f"k must be ≥ 1, got {k}")
        current = self._current()
        if current.snapshot.serving_space is None:
            raise UserError(f"the store at {self.store.path} is empty", hint="ingest a gallery first")
        serving = self.store.space(current.snapshot.serving_space)
        return self.mode.rank(check_queries(queries, serving), serving, current.parts, k, self.distance)

    def snapshot(self) -> Snapshot:
        return self._current().snapshot


def search(
    store: GalleryStore, queries: np.ndarray, k: int, mode: ServingMode, distance: Distance = "cosine"
) -> SearchHits:
    """One-shot top-k search (a ``Searcher`` reuses snapshots across calls)."""
    return Searcher(store, mode, distance).search(queries, k)
