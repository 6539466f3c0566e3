"""One embedding space's vectors on disk: float32 rows, row s holding the item of slot s.

Rows are written to their slots and made durable *before* the SQLite transaction that points items
at them commits, so a reader that follows the item table never reaches a row that is not fully on
disk, and a crash between the two steps only leaves unreferenced bytes that the next attempt
overwrites.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from modelupgrade.arrays import vector_rows
from modelupgrade.errors import UserError
from modelupgrade.store.spaces import SpaceSpec


class VectorFile:
    """A space's float32 rows; the mapping is renewed when the file grows."""

    def __init__(self, path: Path, dim: int) -> None:
        self.path, self.dim = path, dim
        self._map: np.memmap | None = None
        self._mapped_rows = -1

    def rows_on_disk(self) -> int:
        return os.path.getsize(self.path) // (4 * self.dim) if self.path.exists() else 0

    def ensure_rows(self, rows: int) -> None:
        if self.rows_on_disk() < rows:
            with open(self.path, "ab") as fh:
                fh.truncate(rows * self.dim * 4)
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
            self._map = np.memmap(self.path, dtype=np.float32, mode="r+", shape=(rows, self.dim))
            self._mapped_rows = rows
        return self._map

    def read(self, slots: np.ndarray) -> np.ndarray:
        if len(slots) == 0:
            return np.empty((0, self.dim), dtype=np.float32)
        return np.asarray(self._mapping(int(slots.max()) + 1)[slots], dtype=np.float32)

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
