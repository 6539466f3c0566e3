"""One embedding space's vectors on disk: float32 rows, row s holding the item of slot s; and the
checksum that records each stored vector's provenance.

Rows are written to their slots and made durable *before* the SQLite transaction that points items
at them commits, so a reader that follows the item table never reaches a row that is not fully on
disk, and a crash between the two steps only leaves unreferenced bytes that the next attempt
overwrites.

What makes them durable is a journal (``VectorJournal``), not a sync of the rows in place: a
backfill writes its chunks' rows to slots spread over the whole file (the ordering policy decides
which items go first), so syncing a chunk in place writes every page it touches, several times the
chunk's bytes, and a group commit's sync rewrites most of the checksum file. Appending the same rows
to the journal and syncing it writes them once, sequentially; the rows in place are synced once, at
a checkpoint (when the writer lets go of the store, or when the journal has grown past
``JOURNAL_CHECKPOINT_BYTES``), after which the journal is emptied. A writer that takes the store
replays whatever journal is left (a crash before a checkpoint) into the rows first.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from modelupgrade.arrays import vector_rows
from modelupgrade.errors import UserError
from modelupgrade.store.faults import disk_full, is_disk_full
from modelupgrade.store.spaces import SpaceSpec


class VectorFile:
    """A space's rows of ``dim`` values (float32 vectors, or one uint64 per row); the mapping is
    renewed when the file grows, and when the path names another file than the one mapped (a
    space dropped and created again by another process: its old file must never be read)."""

    def __init__(self, path: Path, dim: int, dtype: type[np.generic] = np.float32) -> None:
        self.path, self.dim, self.dtype = path, dim, np.dtype(dtype)
        self._row_bytes = self.dtype.itemsize * dim
        self._map: np.memmap | None = None
        self._mapped_rows = -1
        self._mapped_file: tuple[int, int] | None = None

    def rows_on_disk(self) -> int:
        return os.path.getsize(self.path) // self._row_bytes if self.path.exists() else 0

    def ensure_rows(self, rows: int) -> None:
        """Room for ``rows`` rows, allocated on disk now (not a sparse file, whose pages a full
        disk would refuse only when written through the mapping: SIGBUS, no error line)."""
        have = self.rows_on_disk()
        if have >= rows:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, have * self._row_bytes, (rows - have) * self._row_bytes)
            os.fsync(fd)
        except OSError as err:
            if is_disk_full(err):
                os.ftruncate(fd, have * self._row_bytes)
                raise disk_full(self.path.parent, (rows - have) * self._row_bytes, err) from None
            raise
        finally:
            os.close(fd)

    def truncate(self, rows: int) -> int:
        """Drop every row from ``rows`` on; returns how many there were."""
        have = self.rows_on_disk()
        if have <= rows:
            return 0
        self.close()
        fd = os.open(self.path, os.O_RDWR)
        try:
            os.ftruncate(fd, rows * self._row_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)
        return have - rows

    def _identity(self) -> tuple[int, int] | None:
        try:
            found = os.stat(self.path)
        except FileNotFoundError:
            return None
        return found.st_dev, found.st_ino

    def _mapping(self, rows_needed: int) -> np.memmap:
        identity = self._identity()
        if identity != self._mapped_file:
            self.close()
        if self._map is None or self._mapped_rows < rows_needed:
            rows = self.rows_on_disk()
            if identity is None or rows < rows_needed:
                raise UserError(
                    f"vector file {self.path} holds {rows} rows, the item "
                    f"table needs {rows_needed}",
                    hint="the store directory is damaged or was copied while a "
                    "writer ran; rebuild it",
                )
            self._map = np.memmap(self.path, dtype=self.dtype, mode="r+", shape=(rows, self.dim))
            self._mapped_rows, self._mapped_file = rows, identity
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
        self._mapped_file = None


JOURNAL_SUFFIX = ".journal"
# The journal is checkpointed (rows synced in place, journal emptied) once it holds this much.
JOURNAL_CHECKPOINT_BYTES = 256 << 20

# A record: magic, row count, dimension, CRC-32 of the payload; then the payload: the slots
# (int64), the vectors (float32, rows × dim), their checksums (uint64) and their source content
# hashes (uint64; records of the first format, MUJ1, have none).
_RECORD_HEADER = struct.Struct("<4sIII")
_RECORD_MAGIC = b"MUJ2"
_FIRST_MAGIC = b"MUJ1"


def _crc32(parts: Iterable[bytes | memoryview]) -> int:
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    return crc


def _boot_time() -> float | None:
    """When this machine booted (Linux), to tell a journal written before a power cut."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except OSError:
        return None
    return None


class VectorJournal:
    """Append-only records of the rows written to one space since its last checkpoint.

    A record is durable once ``sync`` returns; one torn by a crash (short, or not matching its
    CRC) can only be the last, was never synced, so nothing was committed on it, and replay
    stops there.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO | None = None

    def size(self) -> int:
        return os.path.getsize(self.path) if self.path.exists() else 0

    def from_before_boot(self) -> bool:
        """Whether the journal holds records written before this machine last booted: rows a
        power cut may have kept off the vector file, which no writer has redone yet. (Rows a
        killed process wrote are in the page cache, which every reader of this machine reads.)"""
        booted = _boot_time()
        if booted is None or not self.path.exists():
            return self.size() > 0
        found = os.stat(self.path)
        return found.st_size > 0 and found.st_mtime < booted

    def append(
        self, slots: np.ndarray, vectors: np.ndarray, sums: np.ndarray, sources: np.ndarray
    ) -> None:
        parts = [
            np.ascontiguousarray(part, dtype=dtype).data.cast("B")
            for part, dtype in (
                (slots, np.int64),
                (vectors, np.float32),
                (sums, np.uint64),
                (sources, np.uint64),
            )
        ]
        header = _RECORD_HEADER.pack(_RECORD_MAGIC, len(slots), vectors.shape[1], _crc32(parts))
        if self._file is None:
            self._file = open(self.path, "ab")  # noqa: SIM115 - held open across appends
        try:
            self._file.write(header)
            for part in parts:
                self._file.write(part)
        except OSError as err:
            if is_disk_full(err):
                needed = len(header) + sum(part.nbytes for part in parts)
                raise disk_full(self.path.parent, needed, err) from None
            raise

    def sync(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
                os.fdatasync(self._file.fileno())
            except OSError as err:
                if is_disk_full(err):
                    raise disk_full(self.path.parent, self.size(), err) from None
                raise

    def records(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """(slots, vectors, checksums, source hashes) of each whole record, in the order they
        were written."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        at = 0
        while at + _RECORD_HEADER.size <= len(data):
            magic, rows, dim, crc = _RECORD_HEADER.unpack_from(data, at)
            width = 16 + 4 * dim + (8 if magic == _RECORD_MAGIC else 0)
            start, end = at + _RECORD_HEADER.size, at + _RECORD_HEADER.size + rows * width
            if magic not in (_RECORD_MAGIC, _FIRST_MAGIC) or end > len(data):
                return
            payload = data[start:end]
            if _crc32([payload]) != crc:
                return
            slots = np.frombuffer(payload, np.int64, rows)
            vectors = np.frombuffer(payload, np.float32, rows * dim, 8 * rows).reshape(rows, dim)
            sums = np.frombuffer(payload, np.uint64, rows, (8 + 4 * dim) * rows)
            sources = (
                np.frombuffer(payload, np.uint64, rows, (16 + 4 * dim) * rows)
                if magic == _RECORD_MAGIC
                else np.zeros(rows, dtype=np.uint64)
            )
            yield slots, vectors, sums, sources
            at = end

    def clear(self) -> None:
        """Empty the journal (its rows are durable in place)."""
        self.close()
        if self.path.exists():
            with open(self.path, "r+b") as fh:
                fh.truncate(0)
                os.fsync(fh.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


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


# A stored checksum or source hash of 0 means "not recorded" (a store written before checksums
# were kept; a vector the store was given rather than computed from content).
UNRECORDED = np.uint64(0)


def content_hashes(contents: np.ndarray) -> np.ndarray:
    """One uint64 per item: BLAKE2b-64 of the source content a vector is made from (the decoded
    image's pixels, shape and dtype included), 0 kept for "not recorded". The store keeps it beside
    each vector, so a backfill tells an item whose image changed since its vector was made."""
    rows = np.ascontiguousarray(contents)
    shape = repr((rows.shape[1:], rows.dtype.str)).encode()
    sums = np.fromiter(
        (
            int.from_bytes(
                hashlib.blake2b(row.tobytes(), digest_size=8, key=shape[:64]).digest(), "little"
            )
            for row in rows
        ),
        dtype=np.uint64,
        count=len(rows),
    )
    sums[sums == UNRECORDED] = np.uint64(1)
    return sums


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
