"""Rows of one space held ready for exact search in this process: a FAISS flat index whose
row i is the prepared vector of slot i (L2-normalised for the cosine distance), kept up to date
row by row.

A search restricts it to a part's slots with a bitmap selector, so a query costs one dot product
per row of the part and nothing per item besides (no part's rows gathered or copied per query, no
gallery normalised per query: what made one query on the embedded store cost hundreds of
milliseconds at 100,000 items). The index only supplies each query's ``limit`` best candidates;
the caller ranks them with the shared kernel on their stored vectors, so answers stay the
simulator's. A snapshot ``cover``s its part first: rows it has not loaded, or whose checksum
changed since (a space created again, a row written again), are read and prepared; rows a
snapshot's part holds never change while it holds them, so each commit loads only its new rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.retrieval.index import _faiss, normalised_float32

# Rows added at a time when the index grows (the index's storage is reallocated on growth).
_GROWTH = 1 << 16


class SpaceMatrix:
    """The prepared rows of one space (``read`` gives stored rows and ``checksums`` their
    checksums, by slot; ``transform`` maps stored rows to the rows searched, e.g. ψ)."""

    def __init__(
        self, dim: int, metric: str, transform: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> None:
        faiss = _faiss()
        self.dim, self.metric, self.transform = dim, metric, transform
        self.index = faiss.IndexFlatL2(dim) if metric == "l2" else faiss.IndexFlatIP(dim)
        self.sums = np.zeros(0, dtype=np.uint64)  # checksum of the row loaded per slot (0: none)
        # the rows as searched, unprepared (kept only when they are not the stored rows: ψ)
        self.raw = np.zeros((0, dim), dtype=np.float32) if transform is not None else None
        self.lock = threading.RLock()

    def _grow(self, rows: int) -> None:
        have = int(self.index.ntotal)
        if rows <= have:
            return
        add = max(rows - have, min(max(have, _GROWTH), 1 << 22))
        self.index.add(np.zeros((add, self.dim), dtype=np.float32))
        self.sums = np.concatenate([self.sums, np.zeros(add, dtype=np.uint64)])
        if self.raw is not None:
            self.raw = np.concatenate([self.raw, np.zeros((add, self.dim), np.float32)])

    def _rows(self) -> np.ndarray:
        """The index's storage as a writable (ntotal, dim) view."""
        faiss = _faiss()
        total = int(self.index.ntotal)
        return faiss.rev_swig_ptr(self.index.get_xb(), total * self.dim).reshape(total, self.dim)

    def cover(
        self,
        slots: np.ndarray,
        checksums: Callable[[np.ndarray], np.ndarray],
        read: Callable[[np.ndarray], np.ndarray],
    ) -> None:
        """Make every row of ``slots`` hold its slot's current vector."""
        if not len(slots):
            return
        with self.lock:
            self._grow(int(slots.max()) + 1)
            # a row written before checksums were kept reads 0: loaded once, as 1
            current = np.maximum(checksums(slots), np.uint64(1))
            changed = self.sums[slots] != current
            stale = slots[changed]
            if not len(stale):
                return
            for start in range(0, len(stale), _GROWTH):
                part = stale[start : start + _GROWTH]
                rows = np.asarray(read(part), dtype=np.float32)
                if self.transform is not None:
                    rows = np.asarray(self.transform(rows), dtype=np.float32)
                    self.raw[part] = rows  # type: ignore[index]
                prepared = normalised_float32(rows) if self.metric == "ip" else rows
                self._rows()[part] = prepared
            self.sums[stale] = current[changed]

    def selector(self, slots: np.ndarray) -> tuple[object, np.ndarray]:
        """A FAISS selector of ``slots`` (and the bitmap it reads, which must outlive it)."""
        faiss = _faiss()
        mask = np.zeros(int(self.index.ntotal), dtype=bool)
        mask[slots] = True
        bits = np.packbits(mask, bitorder="little")
        return faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits)), bits

    def search(self, queries: np.ndarray, limit: int, selector: object) -> np.ndarray:
        """The slots of each query's ``limit`` best rows among the selected ones, as one sorted
        union over the queries."""
        faiss = _faiss()
        if queries.shape[1] != self.dim:
            raise UserError(
                f"query vectors are {queries.shape[1]}-d but gallery vectors are {self.dim}-d",
                hint="a query and the gallery it searches must live in one space "
                "(apply the head first)",
            )
        prepared = normalised_float32(queries) if self.metric == "ip" else queries
        with self.lock:
            _, found = self.index.search(
                np.ascontiguousarray(prepared, dtype=np.float32),
                limit,
                params=faiss.SearchParameters(sel=selector),
            )
        return np.unique(found[found >= 0])
