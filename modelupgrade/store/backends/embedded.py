"""The embedded vector backend: one float32 file per space beside the store's database, one file
of checksums and one of source content hashes per space (``vectors/<space>.f32``, ``.sum`` and
``.src``; ``<space>`` is the space's storage name, its own name). The default: nothing to install
or start.

A part of a snapshot is searched by an exact scan with the shared kernel (``store.index.kind:
flat``), or through a FAISS index per space (``hnsw``, ``ivf``; ``modelupgrade.retrieval.index``)
that finds each query's candidates, which the shared kernel then ranks. The index lives in this
process and follows the gallery as a backfill changes it: a snapshot's part adds the rows committed
since the last one (a committed row never changes, so the index only grows while a space fills), a
part that has shrunk below half of its index (the source space, as its items move out) gets an
index of its own rows, and a search is restricted to the part's rows by a FAISS selector. Extending
per committed chunk costs a backfill nothing and a search the new rows only; an index per snapshot
would rebuild the whole space after every commit. A row whose checksum is not the one indexed (a
space refilled after an abort) rebuilds the index.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.retrieval.distance import Distance
from modelupgrade.retrieval.index import INDEXES, SearchIndex, SearchOptions, normalised_float32
from modelupgrade.store.backends.base import (
    VECTOR_BACKENDS,
    BackendSettings,
    MatrixGallery,
    PartGallery,
    VectorBackend,
    VectorRows,
)
from modelupgrade.store.matrices import SpaceMatrix
from modelupgrade.store.schema import VECTORS_DIR
from modelupgrade.store.spaces import SpaceSpec
from modelupgrade.store.vectors import (
    JOURNAL_CHECKPOINT_BYTES,
    JOURNAL_SUFFIX,
    VectorFile,
    VectorJournal,
)


class _SpaceIndex:
    """A FAISS index over the rows of one space that snapshots have shown, with the slot and the
    checksum of each index row. Rows are only appended; FAISS does not search while it adds, so
    one lock guards both."""

    def __init__(self, spec: SpaceSpec, options: SearchOptions) -> None:
        self.options = options
        self.index: SearchIndex = INDEXES.get(options.index)(spec.dim, options)
        self.slots = np.empty(0, dtype=np.int64)
        self.sums = np.empty(0, dtype=np.uint64)
        self.row_of = np.empty(0, dtype=np.int64)  # slot → index row, −1: not indexed
        self.lock = threading.Lock()

    @property
    def size(self) -> int:
        return len(self.slots)

    def rows(self, slots: np.ndarray) -> np.ndarray:
        """Index rows of ``slots`` (−1 where not indexed)."""
        rows = np.full(len(slots), -1, dtype=np.int64)
        known = slots < len(self.row_of)
        rows[known] = self.row_of[slots[known]]
        return rows

    def prepared(self, vectors: np.ndarray) -> np.ndarray:
        if self.options.metric == "ip":
            return normalised_float32(vectors)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def add(self, slots: np.ndarray, vectors: np.ndarray, sums: np.ndarray) -> None:
        with self.lock:
            if len(self.row_of) <= int(slots.max(initial=-1)):
                grown = np.full(int(slots.max()) + 1, -1, dtype=np.int64)
                grown[: len(self.row_of)] = self.row_of
                self.row_of = grown
            self.row_of[slots] = np.arange(self.size, self.size + len(slots))
            self.index.add(self.prepared(vectors))
            self.slots = np.concatenate([self.slots, slots])
            self.sums = np.concatenate([self.sums, sums])

    def search(
        self, queries: np.ndarray, limit: int, rows: int, allowed: np.ndarray | None
    ) -> np.ndarray:
        """Slots of the ``limit`` best rows per query among the first ``rows`` rows (those of the
        part's snapshot), or among ``allowed`` ones."""
        with self.lock:
            if allowed is None and self.size > rows:
                allowed = np.zeros(self.size, dtype=bool)
                allowed[:rows] = True
            _, found = self.index.search(self.prepared(queries), limit, allowed)
        found = np.unique(found[found >= 0])
        return self.slots[found]


class _IndexedPart(PartGallery):
    """A part searched through its space's index, restricted to the part's rows."""

    def __init__(
        self, backend: EmbeddedVectors, spec: SpaceSpec, index: _SpaceIndex, slots: np.ndarray
    ) -> None:
        self.backend, self.spec, self.index, self.slots = backend, spec, index, slots
        self.rows = index.size
        self.allowed: np.ndarray | None = None
        if len(slots) < index.size:
            self.allowed = np.zeros(index.size, dtype=bool)
            self.allowed[index.rows(slots)] = True

    def check_distance(self, distance: Distance) -> None:
        if distance != self.backend.settings.distance:
            raise UserError(
                f"the store's {self.index.options.index} index ranks by "
                f"{self.backend.settings.distance} distance, the search asks for {distance}",
                hint=f"search with distance {self.backend.settings.distance} (store.distance), "
                "or rebuild the store with the other one",
            )

    def candidates(
        self, queries: np.ndarray, limit: int, distance: Distance
    ) -> tuple[np.ndarray, np.ndarray]:
        slots = np.sort(self.index.search(queries, limit, self.rows, self.allowed))
        return slots, self.vectors(slots)

    def vectors(self, slots: np.ndarray) -> np.ndarray:
        return self.backend.read(self.spec, slots)


def search_options(settings: BackendSettings) -> SearchOptions:
    """The FAISS index options of a store's ``store.index`` settings."""
    index = settings.index
    return SearchOptions(
        index=index.kind,
        use_gpu="never",
        ivf_nlist=index.ivf_nlist,
        ivf_nprobe=index.ivf_nprobe,
        hnsw_m=index.hnsw_m,
        hnsw_ef_construction=index.hnsw_ef_construction,
        hnsw_ef_search=index.hnsw_ef_search,
        metric="l2" if settings.distance == "l2" else "ip",
    )


# k-means wants about this many training vectors per IVF cell (FAISS warns below it): a smaller
# part of an IVF store is scanned exactly until its space has enough rows to train on.
_IVF_TRAIN_PER_CELL = 39


@dataclass
class _SpaceFiles:
    vectors: VectorFile
    sums: VectorFile
    sources: VectorFile
    journal: VectorJournal
    journaled: bool = False  # this process appended since the last checkpoint
    # A reader's copy of journal rows written before a power cut and not yet redone by a writer
    # (``VectorJournal.from_before_boot``): slot → (vector, checksum, source hash).
    overlay: dict[int, tuple[np.ndarray, int, int]] | None = None
    overlay_of: tuple[int, float] | None = None  # the journal's (size, mtime) it was read from

    def all(self) -> tuple[VectorFile, VectorFile, VectorFile]:
        return self.vectors, self.sums, self.sources


_SUFFIXES = (".f32", ".sum", ".src")


@VECTOR_BACKENDS.register("embedded")
class EmbeddedVectors(VectorBackend):
    def __init__(self, store_path: Path, settings: BackendSettings) -> None:
        super().__init__(store_path, settings)
        self.root = store_path / VECTORS_DIR
        self._files: dict[str, _SpaceFiles] = {}
        self._lock = threading.Lock()
        self._options = search_options(settings)
        self._indexes: dict[str, _SpaceIndex] = {}
        self._matrices: dict[str, SpaceMatrix] = {}
        self._index_lock = threading.Lock()

    def storage_for(self, spec: SpaceSpec, draw: Callable[[], int]) -> str:
        """A space's files are named after it (a space created again reuses the name: readers
        tell the new file from the old one by its inode, ``VectorFile``)."""
        return spec.name

    def _files_of(self, spec: SpaceSpec) -> _SpaceFiles:
        return self._files_named(spec.storage or spec.name, spec.dim)

    def _files_named(self, storage: str, dim: int) -> _SpaceFiles:
        with self._lock:
            files = self._files.get(storage)
            if files is None:
                vectors = VectorFile(self.root / f"{storage}.f32", dim)
                sums = VectorFile(self.root / f"{storage}.sum", 1, np.uint64)
                sources = VectorFile(self.root / f"{storage}.src", 1, np.uint64)
                journal = VectorJournal(self.root / f"{storage}{JOURNAL_SUFFIX}")
                files = self._files[storage] = _SpaceFiles(vectors, sums, sources, journal)
            return files

    def add_space(self, spec: SpaceSpec, rows: int) -> None:
        self.reserve([spec], rows)

    def reserve(self, specs: list[SpaceSpec], rows: int) -> None:
        for spec in specs:
            for file in self._files_of(spec).all():
                file.ensure_rows(rows)

    def write(self, spec: SpaceSpec, rows: VectorRows) -> None:
        files = self._files_of(spec)
        files.vectors.write(rows.slots, rows.vectors, durable=False)
        files.sums.write(rows.slots, rows.checksums.reshape(-1, 1), durable=False)
        files.sources.write(rows.slots, rows.sources.reshape(-1, 1), durable=False)
        files.journal.append(rows.slots, rows.vectors, rows.checksums, rows.sources)
        files.journaled = True

    def sync(self, spec: SpaceSpec) -> None:
        files = self._files_of(spec)
        files.journal.sync()
        if files.journal.size() >= JOURNAL_CHECKPOINT_BYTES:
            self._checkpoint(files)

    def checkpoint(self) -> None:
        with self._lock:
            journaled = [files for files in self._files.values() if files.journaled]
        for files in journaled:
            self._checkpoint(files)

    def _checkpoint(self, files: _SpaceFiles) -> None:
        # the rows in place are durable before the journal that also holds them is emptied
        for file in files.all():
            file.sync()
        files.journal.clear()
        files.journaled = False

    def journals_left(self) -> bool:
        return any(path.stat().st_size > 0 for path in self.root.glob(f"*{JOURNAL_SUFFIX}"))

    def recover(self) -> int:
        """Replay each space's journal into its rows, make them durable and empty the journal;
        returns the rows replayed. A journal whose space has no file left (a space discarded
        after it was written) is dropped."""
        replayed = 0
        for path in sorted(self.root.glob(f"*{JOURNAL_SUFFIX}")):
            storage = path.name.removesuffix(JOURNAL_SUFFIX)
            if not (self.root / f"{storage}.f32").exists():
                path.unlink(missing_ok=True)
                continue
            records = list(VectorJournal(path).records())
            if not records:
                VectorJournal(path).clear()
                continue
            files = self._files_named(storage, records[0][1].shape[1])
            for slots, vectors, sums, sources in records:
                files.vectors.write(slots, vectors, durable=False)
                files.sums.write(slots, sums.reshape(-1, 1), durable=False)
                files.sources.write(slots, sources.reshape(-1, 1), durable=False)
                replayed += len(slots)
            self._checkpoint(files)
            files.overlay = files.overlay_of = None
        return replayed

    def _overlaid(self, spec: SpaceSpec) -> _SpaceFiles:
        """The space's files, with the journal rows a power cut kept off them laid over what a
        reader reads until a writer redoes them (``VectorJournal.from_before_boot``)."""
        files = self._files_of(spec)
        journal = files.journal
        if files.journaled or not journal.path.exists():
            files.overlay = files.overlay_of = None
            return files
        found = os.stat(journal.path)
        state = (found.st_size, found.st_mtime)
        if files.overlay_of == state:
            return files
        files.overlay, files.overlay_of = None, state
        if journal.from_before_boot():
            overlay: dict[int, tuple[np.ndarray, int, int]] = {}
            for slots, vectors, sums, sources in journal.records():
                for i, slot in enumerate(slots.tolist()):
                    overlay[slot] = (vectors[i], int(sums[i]), int(sources[i]))
            files.overlay = overlay
        return files

    def _read(self, spec: SpaceSpec, slots: np.ndarray, column: int) -> np.ndarray:
        files = self._overlaid(spec)
        found = files.all()[column].read(slots)
        if files.overlay:
            for row, slot in enumerate(slots.tolist()):
                if slot in files.overlay:
                    value = files.overlay[slot][column]
                    found[row] = value if column == 0 else np.uint64(value)
        return found if column == 0 else found.reshape(-1)

    def read(self, spec: SpaceSpec, slots: np.ndarray) -> np.ndarray:
        return self._read(spec, np.asarray(slots, dtype=np.int64), 0)

    def checksums(self, spec: SpaceSpec, slots: np.ndarray) -> np.ndarray:
        return self._read(spec, np.asarray(slots, dtype=np.int64), 1)

    def sources(self, spec: SpaceSpec, slots: np.ndarray) -> np.ndarray:
        return self._read(spec, np.asarray(slots, dtype=np.int64), 2)

    def provenance(self, spec: SpaceSpec, slots: np.ndarray) -> list[tuple[str, str]]:
        """A space's file holds only that space's vectors: the spaces table records its model."""
        return [(spec.name, spec.model_ref)] * len(slots)

    def destroy(self, specs: list[SpaceSpec], slots: np.ndarray) -> None:
        """Zero the rows of ``slots`` (vector, checksum, source hash) in every space, after the
        journals that may hold a copy of them are checkpointed and emptied."""
        self.recover()
        self.checkpoint()
        slots = np.asarray(slots, dtype=np.int64)
        for spec in specs:
            files = self._files_of(spec)
            rows = files.vectors.rows_on_disk()
            inside = slots[slots < rows]
            if not len(inside):
                continue
            files.vectors.write(inside, np.zeros((len(inside), spec.dim), np.float32), True)
            for file in (files.sums, files.sources):
                file.write(inside, np.zeros((len(inside), 1), np.uint64), True)
        with self._index_lock:
            # an index may hold a copy of a destroyed row
            self._indexes.clear()
            self._matrices.clear()

    def present_slots(self, spec: SpaceSpec) -> np.ndarray:
        """The slots of ``spec``'s file that hold a vector (a recorded checksum)."""
        files = self._files_of(spec)
        rows = files.sums.rows_on_disk()
        if not rows:
            return np.empty(0, dtype=np.int64)
        sums = files.sums.read(np.arange(rows, dtype=np.int64)).reshape(-1)
        return np.flatnonzero(sums != 0).astype(np.int64)

    def discard_beyond(self, specs: list[SpaceSpec], rows: int) -> int:
        removed = 0
        for spec in specs:
            files = self._files_of(spec)
            removed = max(removed, files.vectors.truncate(rows))
            files.sums.truncate(rows)
            files.sources.truncate(rows)
        return removed

    def part(self, spec: SpaceSpec, slots: np.ndarray, rows: str) -> PartGallery:
        if self._options.index == "flat" or (
            self._options.index == "ivf"
            and len(slots) < _IVF_TRAIN_PER_CELL * self._options.ivf_nlist
        ):
            return MatrixGallery(self._matrix_for(spec, slots), slots, partial(self.read, spec))
        return _IndexedPart(self, spec, self._index_for(spec, slots), slots)

    def _matrix_for(self, spec: SpaceSpec, slots: np.ndarray) -> SpaceMatrix:
        """The space's matrix, holding every row of ``slots`` as it is stored now."""
        with self._index_lock:
            matrix = self._matrices.get(spec.storage)
            if matrix is None or matrix.dim != spec.dim:
                matrix = self._matrices[spec.storage] = SpaceMatrix(spec.dim, self._options.metric)
        matrix.cover(
            slots,
            lambda wanted: self.checksums(spec, wanted),
            lambda wanted: self.read(spec, wanted),
        )
        return matrix

    def _index_for(self, spec: SpaceSpec, slots: np.ndarray) -> _SpaceIndex:
        """The space's index, holding every row of ``slots`` as it is stored now."""
        with self._index_lock:
            sums = self.checksums(spec, slots)
            index = self._indexes.get(spec.storage)
            if index is not None:
                rows = index.rows(slots)
                held = rows >= 0
                if 2 * len(slots) < index.size or (index.sums[rows[held]] != sums[held]).any():
                    index = None
            if index is None:
                index = self._indexes[spec.storage] = _SpaceIndex(spec, self._options)
                held = np.zeros(len(slots), dtype=bool)
            new = slots[~held]
            if len(new):
                index.add(new, self.read(spec, new), sums[~held])
            return index

    def describe(self) -> dict[str, str]:
        return {"backend": self.registry_name, "location": str(self.root)}

    def stored(self) -> dict[str, str]:
        if not self.root.exists():
            return {}
        return {path.stem: path.stem for path in self.root.glob("*.f32")}

    def discard(self, storage: str) -> None:
        with self._index_lock:
            self._indexes.pop(storage, None)
            self._matrices.pop(storage, None)
        with self._lock:
            files = self._files.pop(storage, None)
            if files is not None:
                for file in (files.journal, *files.all()):
                    file.close()
            # the journal first: a journal without its space's file is dropped, never replayed
            for suffix in (JOURNAL_SUFFIX, *_SUFFIXES):
                (self.root / f"{storage}{suffix}").unlink(missing_ok=True)

    def serve(self, spec: SpaceSpec) -> str:
        """Nothing outside the store reads its files: the store's serving space record is all."""
        return f"serving space {spec.name}"

    def close(self) -> None:
        with self._lock:
            for files in self._files.values():
                for file in (files.journal, *files.all()):
                    file.close()
            self._files.clear()
