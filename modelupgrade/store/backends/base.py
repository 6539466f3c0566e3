"""Where a store keeps its vectors: the interface every vector backend implements.

A store's items, ordering scores and backfill ledger always live in its SQLite database (the ledger
is what survives a SIGKILL); its *vectors*, and the search over them, live in a vector backend
(registry ``VECTOR_BACKENDS``): the embedded one (one float32 file per space beside the database,
scanned exactly) or Milvus (one collection per space, Milvus Lite in a local file or a server).

The store calls a backend in one order, whatever it is: vectors are written to their slots of a
space (an upsert: writing a slot again replaces its vector), made durable with ``sync``, and only
then does an SQLite transaction point items at them. So a reader that follows the item table never
meets a vector that is not stored, and a job killed between the two steps redoes the same writes.

Each stored vector carries its provenance: the space it belongs to (named after the model version
that produced it) and its checksum (``modelupgrade.store.vectors.vector_checksums``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from modelupgrade.config import StoreParams
from modelupgrade.registry_util import Registry
from modelupgrade.retrieval.distance import Distance, check_distance
from modelupgrade.store.spaces import SpaceSpec

# The store's meta keys that record its backend when it is created (a store keeps its backend).
BACKEND_META = ("vector_backend", "vector_uri", "vector_distance", "vector_collection")


@dataclass(frozen=True)
class BackendSettings:
    """Which backend holds a store's vectors (params.yaml's ``store.backend`` and ``store.uri``).

    ``uri`` is the backend's address: unused by the embedded backend; for Milvus a local ``.db``
    file (Milvus Lite) or a server URI, and empty for a Milvus Lite file inside the store directory.
    ``distance`` is what its index ranks by. ``collection`` names the store's vectors inside the
    backend (a prefix of its Milvus collections); a new store draws one.
    """

    kind: str = "embedded"
    uri: str = ""
    distance: Distance = "cosine"
    collection: str = ""

    @classmethod
    def of(cls, params: StoreParams) -> BackendSettings:
        return cls(params.backend, params.uri, params.distance)

    def as_meta(self) -> dict[str, str]:
        return dict(zip(BACKEND_META, (self.kind, self.uri, self.distance, self.collection)))

    @classmethod
    def from_meta(cls, meta: dict[str, str | None]) -> BackendSettings:
        """The settings a store recorded; a store that recorded none is an embedded one."""
        kind, uri, distance, collection = (meta.get(key) for key in BACKEND_META)
        if kind is None:
            return cls()
        return cls(kind, uri or "", check_distance(distance or "cosine"), collection or "")


class PartGallery(ABC):
    """The vectors of one part of a snapshot (the items one space holds), ready to search."""

    slots: np.ndarray

    @abstractmethod
    def nearest(
        self, queries: np.ndarray, k: int, distance: Distance
    ) -> tuple[np.ndarray, np.ndarray]:
        """Slots and their vectors among which every query's exact ``k`` nearest items of the part
        lie (all of them, or the candidates the backend's own search returns); the caller ranks
        them with the shared kernel (``modelupgrade.retrieval``)."""

    @abstractmethod
    def vectors(self, slots: np.ndarray) -> np.ndarray:
        """The stored vectors of ``slots`` (all in this part)."""


class VectorBackend(ABC):
    """A store's vectors: one set of slots per embedding space."""

    registry_name: ClassVar[str]

    def __init__(self, store_path: Path, settings: BackendSettings) -> None:
        self.store_path, self.settings = store_path, settings

    @classmethod
    def prepared(cls, store_path: Path, settings: BackendSettings) -> BackendSettings:
        """``settings`` completed for a new store at ``store_path`` (checked, names drawn)."""
        return settings

    @abstractmethod
    def add_space(self, spec: SpaceSpec, rows: int) -> None:
        """Room for ``spec``'s vectors (its first ``rows`` slots); an existing space of another
        dimension is an error."""

    @abstractmethod
    def reserve(self, specs: list[SpaceSpec], rows: int) -> None:
        """Every space of ``specs`` can take vectors for slots below ``rows``."""

    @abstractmethod
    def write(
        self, spec: SpaceSpec, slots: np.ndarray, vectors: np.ndarray, checksums: np.ndarray
    ) -> None:
        """Store (upsert) ``vectors`` and their checksums at ``slots`` of ``spec``; durable only
        after ``sync``."""

    @abstractmethod
    def sync(self, spec: SpaceSpec) -> None:
        """Make every vector written to ``spec`` durable (before anything points at it)."""

    @abstractmethod
    def read(self, spec: SpaceSpec, slots: np.ndarray) -> np.ndarray:
        """The vectors of ``slots`` in ``spec``, in that order."""

    @abstractmethod
    def checksums(self, spec: SpaceSpec, slots: np.ndarray) -> np.ndarray:
        """The checksums recorded with the vectors of ``slots`` (uint64, 0: none recorded)."""

    @abstractmethod
    def provenance(self, spec: SpaceSpec, slots: np.ndarray) -> list[tuple[str, str]]:
        """The (space, model reference) recorded with each vector of ``slots``."""

    @abstractmethod
    def part(self, spec: SpaceSpec, slots: np.ndarray, items: int) -> PartGallery:
        """The part of a snapshot that ``spec`` holds: its ``slots`` out of ``items`` in all."""

    @abstractmethod
    def describe(self) -> dict[str, str]:
        """Where the vectors live, for a status (never a secret)."""

    @abstractmethod
    def discard(self, space: str) -> None:
        """Delete the vectors of ``space``, a space no item and no space row names any more."""

    @abstractmethod
    def close(self) -> None: ...


VECTOR_BACKENDS: Registry[VectorBackend] = Registry("vector backend")
