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
that produced it), its checksum (``modelupgrade.store.vectors.vector_checksums``) and the hash of
the source content it was made from (``modelupgrade.store.vectors.content_hashes``; 0 where the
store was given the vector, not the content).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from modelupgrade.config import StoreParams
from modelupgrade.config.store import StoreIndexParams
from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject
from modelupgrade.plugins import Registry
from modelupgrade.retrieval.distance import Distance, check_distance
from modelupgrade.store.matrices import SpaceMatrix
from modelupgrade.store.spaces import SpaceSpec

# ``scheme://user:password@host``: the credentials part of a URI.
_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]*@")


def without_credentials(text: str) -> str:
    """``text`` with the credentials of every URI in it replaced by ``***``: what may be shown,
    logged or answered (a Milvus URI may carry ``user:password@``)."""
    return _CREDENTIALS.sub(r"\1***@", text)


def uri_credentials(uri: str) -> str | None:
    """The ``user:password`` of ``uri`` (None without credentials)."""
    match = re.match(r"(?i)^[a-z][a-z0-9+.-]*://([^/@\s]*)@", uri)
    return None if match is None else match.group(1)


# The store's meta keys that record its backend when it is created (a store keeps its backend).
BACKEND_META = (
    "vector_backend",
    "vector_uri",
    "vector_distance",
    "vector_collection",
    "vector_index",
)


@dataclass(frozen=True)
class BackendSettings:
    """Which backend holds a store's vectors (params.yaml's ``store.backend`` and ``store.uri``).

    ``uri`` is the backend's address: unused by the embedded backend; for Milvus a local ``.db``
    file (Milvus Lite) or a server URI, and empty for a Milvus Lite file inside the store directory.
    ``distance`` is what its index ranks by. ``collection`` names the store's vectors inside the
    backend (a prefix of its Milvus collections); a new store draws one. ``index`` is how each
    space is searched (``store.index``: flat, hnsw or ivf, and their parameters).
    """

    kind: str = "embedded"
    uri: str = ""
    distance: Distance = "cosine"
    collection: str = ""
    index: StoreIndexParams = field(default_factory=StoreIndexParams)

    @classmethod
    def of(cls, params: StoreParams) -> BackendSettings:
        return cls(params.backend, params.uri, params.distance, index=params.index)

    def as_meta(self) -> dict[str, str]:
        values = (self.kind, self.uri, self.distance, self.collection, self.index.model_dump_json())
        return dict(zip(BACKEND_META, values, strict=True))

    @classmethod
    def from_meta(cls, meta: dict[str, str | None]) -> BackendSettings:
        """The settings a store recorded; a store that recorded none is an embedded one, and one
        that recorded no index is searched exactly (it was created before indexes)."""
        kind, uri, distance, collection, index = (meta.get(key) for key in BACKEND_META)
        if kind is None:
            return cls()
        return cls(
            kind,
            uri or "",
            check_distance(distance or "cosine"),
            collection or "",
            StoreIndexParams.model_validate_json(index) if index else StoreIndexParams(),
        )


@dataclass(frozen=True)
class VectorRows:
    """Rows to store in one space: each slot's vector, its checksum, the hash of the content it was
    made from (0: not recorded), and which write makes them authoritative (``written_by``: the
    backfill and chunk that commits them; (0, 0) for an ingest or an update)."""

    slots: np.ndarray
    vectors: np.ndarray
    checksums: np.ndarray
    sources: np.ndarray
    written_by: tuple[int, int] = (0, 0)
    # each slot's item id, for a vector database that names its rows' items to outside readers
    item_ids: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        count = len(self.slots)
        if self.item_ids is not None and len(self.item_ids) != count:
            raise ValueError(f"{count} slots for {len(self.item_ids)} item ids")
        if not (len(self.vectors) == len(self.checksums) == len(self.sources) == count):
            raise ValueError(
                f"{count} slots for {len(self.vectors)} vectors, {len(self.checksums)} checksums "
                f"and {len(self.sources)} source hashes"
            )

    def __len__(self) -> int:
        return len(self.slots)


def candidate_count(k: int, part_size: int) -> int:
    """Candidates an index search returns per query for a top-``k``: a few past ``k``, so that float
    rounding of the index's scores against the shared kernel's distances cannot move an item
    across the k-th place; all of a part no larger than that."""
    return min(part_size, k + max(k, 16))


class PartGallery(ABC):
    """The vectors of one part of a snapshot (the items one space holds), ready to search."""

    slots: np.ndarray

    def nearest(
        self, queries: np.ndarray, k: int, distance: Distance
    ) -> tuple[np.ndarray, np.ndarray]:
        """Slots and their vectors among which the caller ranks every query's ``k`` nearest items
        of the part with the shared kernel (``modelupgrade.retrieval``): all of them, or the
        candidates the backend's index finds for the queries, a few more than ``k`` each. With a
        flat index every query's exact ``k`` nearest items are among them; with an approximate one
        (``store.index``: hnsw, ivf), those the index finds."""
        self.check_distance(distance)
        limit = candidate_count(k, len(self.slots))
        if limit == len(self.slots):
            return self.slots, self.vectors(self.slots)
        return self.candidates(queries, limit, distance)

    def check_distance(self, distance: Distance) -> None:
        """Refuse a distance the part's index cannot rank by (none, unless a part says so)."""

    @abstractmethod
    def candidates(
        self, queries: np.ndarray, limit: int, distance: Distance
    ) -> tuple[np.ndarray, np.ndarray]:
        """Slots and vectors of the part's ``limit`` best rows for each query by the backend's
        index (``limit`` is fewer than the part holds)."""

    @abstractmethod
    def vectors(self, slots: np.ndarray) -> np.ndarray:
        """The stored vectors of ``slots`` (all in this part)."""


class MatrixGallery(PartGallery):
    """A part searched exactly through a space matrix restricted to the part's rows (made once per
    snapshot); ``read`` gives the vectors of slots the caller ranks: the stored ones (the embedded
    backend) or ψ of them (a forward-transformed part)."""

    def __init__(
        self, matrix: SpaceMatrix, slots: np.ndarray, read: Callable[[np.ndarray], np.ndarray]
    ) -> None:
        self.matrix, self.slots, self.read = matrix, slots, read
        self.rows = matrix.part(slots)

    def candidates(
        self, queries: np.ndarray, limit: int, distance: Distance
    ) -> tuple[np.ndarray, np.ndarray]:
        found = self.matrix.search(queries, limit, self.rows)
        return found, self.read(found)

    def vectors(self, slots: np.ndarray) -> np.ndarray:
        return self.read(slots)


class VectorsUnavailable(UserError):
    """The store's vectors cannot be reached now (a Milvus server down, a Milvus Lite file that
    another process holds): the fault of where the vectors live, not of a request, so the service
    answers it with 503, not 400; running the command again once they are back succeeds."""


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
    def storage_for(self, spec: SpaceSpec, draw: Callable[[], int]) -> str:
        """Where a new space's vectors will live (``SpaceSpec.storage``); ``draw`` hands out a
        number the store never hands out again."""

    @abstractmethod
    def add_space(self, spec: SpaceSpec, rows: int) -> None:
        """Room for ``spec``'s vectors (its first ``rows`` slots); an existing space of another
        dimension is an error."""

    @abstractmethod
    def reserve(self, specs: list[SpaceSpec], rows: int) -> None:
        """Every space of ``specs`` can take vectors for slots below ``rows``; a disk without
        room for them is a ``faults.DiskFull`` here, before anything is written."""

    @abstractmethod
    def write(self, spec: SpaceSpec, rows: VectorRows) -> None:
        """Store (upsert) ``rows`` in ``spec``; durable only after ``sync``."""

    @abstractmethod
    def sync(self, spec: SpaceSpec) -> None:
        """Make every vector written to ``spec`` durable (before anything points at it): after a
        crash, they are where readers find them once ``recover`` has run."""

    @abstractmethod
    def read(self, spec: SpaceSpec, slots: np.ndarray) -> np.ndarray:
        """The vectors of ``slots`` in ``spec``, in that order."""

    @abstractmethod
    def checksums(self, spec: SpaceSpec, slots: np.ndarray) -> np.ndarray:
        """The checksums recorded with the vectors of ``slots`` (uint64, 0: none recorded)."""

    @abstractmethod
    def sources(self, spec: SpaceSpec, slots: np.ndarray) -> np.ndarray:
        """The source content hashes recorded with the vectors of ``slots`` (uint64, 0: none)."""

    @abstractmethod
    def destroy(self, specs: list[SpaceSpec], slots: np.ndarray) -> None:
        """Remove the vectors of ``slots`` from every space of ``specs`` for good (overwritten on
        disk, deleted in the vector database), durably; slots no item names any more."""

    @abstractmethod
    def discard_beyond(self, specs: list[SpaceSpec], rows: int) -> int:
        """Remove whatever a writer that died before its commit stored at slots ``rows`` and
        above (no item names them); returns the rows removed."""

    @abstractmethod
    def provenance(self, spec: SpaceSpec, slots: np.ndarray) -> list[tuple[str, str]]:
        """The (space, model reference) recorded with each vector of ``slots``."""

    @abstractmethod
    def part(self, spec: SpaceSpec, slots: np.ndarray, rows: str) -> PartGallery:
        """The part of a snapshot that ``spec`` holds: its ``slots`` (ascending), which are the
        rows of ``spec``'s vectors that ``rows`` selects (``snapshots.part_filter``: a vector
        database searches by it, constant in size; the embedded store by the slots)."""

    def index_settled(self, spec: SpaceSpec, timeout_s: float = 30.0) -> bool:
        """Wait until ``spec``'s index covers every row the space holds (True) or ``timeout_s``
        passes (False). A backend that indexes each row as it writes it is always settled; a
        vector database builds its index after a flush and searches what it has not indexed yet
        exhaustively, so a recall measured before it settles is not the index's."""
        return True

    @abstractmethod
    def describe(self) -> dict[str, str]:
        """Where the vectors live, for a status (never a secret)."""

    @abstractmethod
    def discard(self, storage: str) -> None:
        """Delete the vectors kept under ``storage`` (``SpaceSpec.storage``), a space no item and
        no space row names any more."""

    def stored(self) -> dict[str, str]:
        """Storage name → space name of every space whose vectors the backend holds for this
        store, whether or not the store's tables name it (what a verification compares)."""
        return {}

    @abstractmethod
    def serve(self, spec: SpaceSpec) -> str:
        """Point whatever the backend's own readers follow at ``spec``'s vectors (a cutover or a
        rollback; idempotent); returns what now points where, for the record. The store's own
        readers follow its ``serving_space`` record instead."""

    def mismatched(self, spec: SpaceSpec, slots: np.ndarray, batch: int = 65536) -> list[int]:
        """The slots among ``slots`` whose stored vector in ``spec`` does not match the checksum
        or the space recorded with it when it was written."""
        from modelupgrade.store.vectors import UNRECORDED, vector_checksums

        bad: list[int] = []
        for start in range(0, len(slots), batch):
            part = np.asarray(slots[start : start + batch], dtype=np.int64)
            stored = self.checksums(spec, part)
            recomputed = vector_checksums(self.read(spec, part))
            bad += [int(s) for s in part[(stored != UNRECORDED) & (stored != recomputed)]]
            bad += [
                int(slot)
                for slot, (recorded, _) in zip(part, self.provenance(spec, part), strict=True)
                if recorded != spec.name
            ]
        return sorted(set(bad))

    # Whether the backend keeps the store's serving state for readers that do not read the
    # store's database (``publish``).
    publishes: bool = False

    def publish(self, state: JsonObject) -> None:
        """Keep ``state`` (``snapshots.serving_state``) where the backend's own readers find it."""

    def mark_moved(self, spec: SpaceSpec, slots: np.ndarray, by: tuple[int, int]) -> None:
        """Record that chunk ``by`` (backfill, chunk) of a backfill out of ``spec`` moves the items
        of ``slots`` out of it, where the backend's search filters rows by their own state (a
        vector database); nothing to do where a part is searched by its slots."""

    def write_mark(self) -> int:
        """A mark of this process's latest write (a Milvus server's timestamp) for the database
        to record with the commit that points at it, so that a reader of that commit waits for it
        (``fence``); 0: the backend's reads see every write at once."""
        return 0

    fence: Callable[[], int] = staticmethod(lambda: 0)

    def checkpoint(self) -> None:
        """Whatever ``sync`` made durable only in a log of the backend's own is made durable where
        readers find it, and the log emptied. The store calls it when its writer lets go."""

    def recover(self) -> int:
        """Redo what a writer that crashed before its checkpoint left in such a log (idempotent);
        returns the vectors redone. The store calls it when a writer takes the store, before it
        writes anything."""
        return 0

    def journals_left(self) -> bool:
        """Whether a crashed writer left anything for ``recover`` (cheap: a reader that opens the
        store asks)."""
        return False

    def reachable(self) -> None:
        """Raise ``VectorsUnavailable`` unless the vectors can be reached now. A writer whose
        ledger change must be followed by a vector one (an abort deletes the target's vectors)
        asks first, so that it is refused before the ledger changes. Local files always are."""

    @abstractmethod
    def close(self) -> None: ...


VECTOR_BACKENDS: Registry[VectorBackend] = Registry("vector backend")
