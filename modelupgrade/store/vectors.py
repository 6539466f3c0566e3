"""One embedding space's vectors on disk: float32 rows, row s holding the item of slot s; and the
checksum that records each stored vector's provenance.

Rows are written to their slots and made durable *before* the SQLite transaction that points items
at them commits, so a reader that follows the item table never reaches a row that is not fully on
disk, and a crash between the two steps only leaves unreferenced bytes that the next attempt
overwrites.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np

from modelupgrade.arrays import vector_rows
from modelupgrade.errors import UserError
from modelupgrade.store.spaces import SpaceSpec


class VectorFile:
    """A space's rows of ``dim`` values (float32 vectors, or one uint64 checksum per row); the
    mapping is renewed when the file grows."""

    def __init__(self, path: Path, dim: int, dtype: type[np.generic] = np.float32) -> None:
        self.path, self.dim, self.dtype = path, dim, np.dtype(dtype)
        self._row_bytes = self.dtype.itemsize * dim
        self._map: np.memmap | None = None
        self._mapped_rows = -1

    def rows_on_disk(self) -> int:
        return os.path.getsize(self.path) // self._row_bytes if self.path.exists() else 0

    def ensure_rows(self, rows: int) -> None:
        if self.rows_on_disk() < rows:
            with open(self.path, "ab") as fh:
                fh.truncate(rows * self._row_bytes)
                fh.flush()
                os.fsync(fh.fileno())

    def _mapping(self, rows_needed: int) -> np.memmap:
        if self._map is None or self._mapped_rows < rows_needed:
            rows = self.rows_on_disk()
            if rows < rows_needed:
                raise UserError(
                    f"vector file {self.path} holds {rows} rows, the item "
                    f"table needs {rows_needed}",
                    hint="the store directory is damaged or was copied while a "
                    "writer ran; rebuild it",
                )
            self._map = np.memmap(self.path, dtype=self.dtype, mode="r+", shape=(rows, self.dim))
            self._mapped_rows = rows
        return self._map

    def read(self, slots: np.ndarray) -> np.ndarray:
        if len(slots) == 0:
            return np.empty((0, self.dim), dtype=self.dtype)
        return np.asarray(self._mapping(int(slots.max()) + 1)[slots], dtype=self.dtype)

    def write(self, slots: np.ndarray, vectors: np.ndarray, durable: bool) -> None:
        if len(slots) == 0:
            return
        mapping = self._mapping(int(slots.max()) + 1)
        mapping[slots] = vectors
        if durable:
            self._sync(mapping)  # the rows are on disk before anything points at them

    def sync(self) -> None:
        if self._map is not None:
            self._sync(self._map)

    def _sync(self, mapping: np.memmap) -> None:
        if sys.platform.startswith("linux"):
            # Linux implements msync(MS_SYNC) of a shared file mapping as fsync of that range, so
            # fdatasync writes the same dirty pages; unlike np.memmap.flush it releases the GIL,
            # which lets a backfill compute its next chunk while this one is made durable.
            fd = os.open(self.path, os.O_RDWR)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        else:
            mapping.flush()

    def close(self) -> None:
        self._map = None
        self._mapped_rows = -1


def check_vectors(vectors: np.ndarray, space: SpaceSpec, what: str) -> np.ndarray:
    """``vectors`` as contiguous float32 (N, dim of ``space``), or a UserError
    saying what is wrong."""
    array = np.asarray(vectors)
    if array.ndim == 2 and array.shape[1] != space.dim:
        raise UserError(
            f"{what} have dimension {array.shape[1]}, but space {space.name!r} holds "
            f"{space.dim}-d vectors",
            hint="the vectors must come from the model version the space is named after",
        )
    return vector_rows(array, what)


# A stored checksum of 0 means "not recorded" (a store written before checksums were kept).
UNRECORDED = np.uint64(0)


def vector_checksums(vectors: np.ndarray) -> np.ndarray:
    """One uint64 per row: BLAKE2b-64 of the row's float32 bytes (0 is kept for "unrecorded").

    Every backend stores it with the vector and ``GalleryStore.verify_vectors`` recomputes it, so a
    vector changed or mixed up after it was written is detected.
    """
    rows = np.ascontiguousarray(vectors, dtype=np.float32)
    sums = np.fromiter(
        (
            int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(), "little")
            for row in rows
        ),
        dtype=np.uint64,
        count=len(rows),
    )
    sums[sums == UNRECORDED] = np.uint64(1)
    return sums
