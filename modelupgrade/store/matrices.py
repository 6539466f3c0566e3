"""Rows of one space held ready for exact search in this process: a FAISS flat index of the
prepared vectors (L2-normalised for the cosine distance) of the slots searched so far, in the
order they were first loaded, kept up to date row by row.

The index holds only rows that exist: a space being backfilled holds the rows written so far, not
one row per slot of the gallery, so a scan of it costs what it holds. A snapshot's part is a
``MatrixPart``: its rows as a mask and as a FAISS bitmap selector, made once per snapshot; a row,
once given to a slot, stays that slot's, so a part made earlier stays right while rows are added
for later snapshots. A search scans the whole index without a selector and keeps the part's rows
(FAISS's plain scan is about 1.7× faster per row than its selector path), asking for enough
candidates that each query keeps its ``limit`` best of the part; a query that keeps fewer, because
its neighbours are mostly outside the part, is searched again with the selector. Either way the
answer is exact: a part row missing from the plain scan's candidates is farther than every part
row kept. A part that is a small share of the rows is searched with the selector at once.

No part's rows are gathered or copied per query and no gallery is normalised per query (what made
one query on the embedded store cost hundreds of milliseconds at 100,000 items). The index only
supplies each query's ``limit`` best candidates; the caller ranks them with the shared kernel on
their stored vectors, so answers stay the simulator's. A snapshot ``cover``s its part first: rows
it has not loaded, or whose checksum changed since (a space created again, a row written again),
are read and prepared; rows a snapshot's part holds never change while it holds them, so each
commit loads only its new rows.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.retrieval.index import _faiss, normalised_float32

# Rows read and prepared at a time when a part is covered.
_BATCH = 1 << 16
# Below this share of the index's rows a part is searched with its selector at once: a plain scan
# would need too many candidates per query to keep enough of the part's.
_PLAIN_SCAN_SHARE = 0.05
# Candidates a plain scan asks for: twice what the part's share of the rows would give a query its
# ``limit`` of the part, and a few more.
_OVERFETCH, _OVERFETCH_EXTRA = 2.0, 16


def _grown(array: np.ndarray, length: int, fill: int) -> np.ndarray:
    """``array``, or a copy at least twice as long with the new rows ``fill``ed, so that it holds
    ``length`` rows."""
    if length <= len(array):
        return array
    grown = np.full((max(length, 2 * len(array), 1024), *array.shape[1:]), fill, array.dtype)
    grown[: len(array)] = array
    return grown


@dataclass(frozen=True)
class MatrixPart:
    """The rows of a snapshot's part in a ``SpaceMatrix``: ``member[row]`` (rows added after it was
    made are beyond its length: not members), a FAISS selector of them (``bits`` must outlive it),
    and how many rows the part holds."""

    member: np.ndarray
    selector: object
    bits: np.ndarray
    size: int


class SpaceMatrix:
    """The prepared rows of one space (``read`` gives stored rows and ``checksums`` their
    checksums, by slot; ``transform`` maps stored rows to the rows searched, e.g. ψ)."""

    def __init__(
        self, dim: int, metric: str, transform: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> None:
        faiss = _faiss()
        self.dim, self.metric, self.transform = dim, metric, transform
        self.index = faiss.IndexFlatL2(dim) if metric == "l2" else faiss.IndexFlatIP(dim)
        # Per slot and per row; only the first ``rows`` rows of the per-row arrays are in use.
        self.row_of_slot = np.full(0, -1, dtype=np.int64)  # -1: the slot has no row yet
        self.slot_of_row = np.zeros(0, dtype=np.int64)
        self.sums = np.zeros(0, dtype=np.uint64)  # checksum of the vector loaded per row (0: none)
        # the rows as searched, unprepared (kept only when they are not the stored rows: ψ)
        self.raw = np.zeros((0, dim), dtype=np.float32) if transform is not None else None
        self.lock = threading.RLock()

    @property
    def rows(self) -> int:
        return int(self.index.ntotal)

    def _storage(self) -> np.ndarray:
        """The index's storage as a writable (rows, dim) view."""
        faiss = _faiss()
        return faiss.rev_swig_ptr(self.index.get_xb(), self.rows * self.dim).reshape(
            self.rows, self.dim
        )

    def _rows_of(self, slots: np.ndarray) -> np.ndarray:
        """The rows of ``slots``, -1 for a slot that has none."""
        rows = np.full(len(slots), -1, dtype=np.int64)
        known = slots < len(self.row_of_slot)
        rows[known] = self.row_of_slot[slots[known]]
        return rows

    def _prepared(self, stored: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The rows searched for ``stored`` rows, and the transformed rows (ψ) to keep."""
        rows = np.asarray(stored, dtype=np.float32)
        raw = None
        if self.transform is not None:
            rows = raw = np.asarray(self.transform(rows), dtype=np.float32)
        prepared = normalised_float32(rows) if self.metric == "ip" else rows
        return np.ascontiguousarray(prepared, dtype=np.float32), raw

    def _append(self, slots: np.ndarray, stored: np.ndarray, sums: np.ndarray) -> None:
        prepared, raw = self._prepared(stored)
        first, end = self.rows, self.rows + len(slots)
        self.index.add(prepared)
        # The per-row arrays grow geometrically, like the index's own storage: a commit appends
        # a chunk's rows at a cost of the chunk, not of the rows held before it.
        self.row_of_slot = _grown(self.row_of_slot, int(slots.max()) + 1, -1)
        self.row_of_slot[slots] = np.arange(first, end)
        self.slot_of_row = _grown(self.slot_of_row, end, 0)
        self.slot_of_row[first:end] = slots
        self.sums = _grown(self.sums, end, 0)
        self.sums[first:end] = sums
        if self.raw is not None:
            self.raw = _grown(self.raw, end, 0)
            self.raw[first:end] = raw

    def _rewrite(self, rows: np.ndarray, stored: np.ndarray, sums: np.ndarray) -> None:
        prepared, raw = self._prepared(stored)
        self._storage()[rows] = prepared
        if self.raw is not None:
            self.raw[rows] = raw
        self.sums[rows] = sums

    def cover(
        self,
        slots: np.ndarray,
        checksums: Callable[[np.ndarray], np.ndarray],
        read: Callable[[np.ndarray], np.ndarray],
    ) -> None:
        """Make a row of every slot of ``slots`` hold its slot's current vector."""
        if not len(slots):
            return
        with self.lock:
            for start in range(0, len(slots), _BATCH):
                batch = np.asarray(slots[start : start + _BATCH], dtype=np.int64)
                # a row written before checksums were kept reads 0: loaded once, as 1
                current = np.maximum(checksums(batch), np.uint64(1))
                rows = self._rows_of(batch)
                held = rows >= 0
                stale = held.copy()
                stale[held] = self.sums[rows[held]] != current[held]
                if stale.any():
                    self._rewrite(rows[stale], read(batch[stale]), current[stale])
                if not held.all():
                    self._append(batch[~held], read(batch[~held]), current[~held])

    def part(self, slots: np.ndarray) -> MatrixPart:
        """The part of ``slots`` (covered), to search with ``search``."""
        faiss = _faiss()
        with self.lock:
            member = np.zeros(self.rows, dtype=bool)
            member[self.row_of_slot[slots]] = True
        bits = np.packbits(member, bitorder="little")
        selector = faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits))
        return MatrixPart(member, selector, bits, len(slots))

    def transformed(self, slots: np.ndarray) -> np.ndarray:
        """The transformed rows (ψ) of covered ``slots``."""
        assert self.raw is not None, "only a matrix with a transform keeps its transformed rows"
        return self.raw[self.row_of_slot[slots]]

    def search(self, queries: np.ndarray, limit: int, part: MatrixPart) -> np.ndarray:
        """The slots of each query's ``limit`` best rows of ``part``, as one sorted union over the
        queries."""
        if queries.shape[1] != self.dim:
            raise UserError(
                f"query vectors are {queries.shape[1]}-d but gallery vectors are {self.dim}-d",
                hint="a query and the gallery it searches must live in one space "
                "(apply the head first)",
            )
        prepared = normalised_float32(queries) if self.metric == "ip" else queries
        prepared = np.ascontiguousarray(prepared, dtype=np.float32)
        with self.lock:
            share = part.size / max(self.rows, 1)
            if share < _PLAIN_SCAN_SHARE:
                return np.unique(self.slot_of_row[self._selected(prepared, limit, part)])
            wanted = min(self.rows, math.ceil(_OVERFETCH * limit / share) + _OVERFETCH_EXTRA)
            _, found = self.index.search(prepared, wanted)
            kept = self._members(found, part, limit)
            short = np.flatnonzero((kept >= 0).sum(axis=1) < min(limit, part.size))
            rows = [kept[kept >= 0].reshape(-1)]
            if len(short):  # these queries' neighbours lie mostly outside the part
                rows.append(self._selected(prepared[short], limit, part))
            return np.unique(self.slot_of_row[np.concatenate(rows)])

    def _members(self, found: np.ndarray, part: MatrixPart, limit: int) -> np.ndarray:
        """Each query's first ``limit`` candidates that are rows of ``part``, -1 elsewhere (a
        query's candidates come best first)."""
        inside = (found >= 0) & (found < len(part.member))
        inside[inside] = part.member[found[inside]]
        inside &= np.cumsum(inside, axis=1) <= limit
        return np.where(inside, found, -1)

    def _selected(self, prepared: np.ndarray, limit: int, part: MatrixPart) -> np.ndarray:
        faiss = _faiss()
        _, found = self.index.search(
            prepared, limit, params=faiss.SearchParameters(sel=part.selector)
        )
        return found[found >= 0]
