"""The gallery store: an SQLite item table plus one on-disk float32 array per embedding space.

Layout of a store directory::

    store.sqlite            items, spaces, backfills, chunk_log, meta (schema version)
    vectors/<space>.f32     float32 rows, shape (capacity, dim); item ``slot`` s lives in row s

Every item has one fixed row slot, the same in every space file, and one ``space`` column naming the
space that holds its authoritative vector. Vectors are written to their slots and made durable
*before* the SQLite transaction that points items at them commits, so a reader that follows the
item table never reaches a row that is not fully on disk, and a crash between the two steps only
leaves unreferenced bytes that the next attempt overwrites.

SQLite runs in WAL mode: readers see the last committed state while a writer works, and a writer
killed mid-transaction leaves the previous state intact.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.store.spaces import SpaceSpec

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DATABASE_FILE = "store.sqlite"
VECTORS_DIR = "vectors"

# Item backfill states: 'idle' (not part of a running backfill), 'pending' (queued in a planned
# chunk), 'done' (its vector in the target space is committed), 'failed' (skipped with a reason,
# still served from its previous space).
ITEM_STATES = ("idle", "pending", "done", "failed")

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE spaces (
    name TEXT PRIMARY KEY,
    dim INTEGER NOT NULL CHECK (dim > 0),
    upgrades_from TEXT NOT NULL,
    backward_compatible INTEGER NOT NULL,
    model_ref TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE items (
    slot INTEGER PRIMARY KEY,
    item_id TEXT NOT NULL UNIQUE,
    source_path TEXT NOT NULL,
    source_index INTEGER NOT NULL,
    label INTEGER,
    space TEXT NOT NULL REFERENCES spaces(name),
    score REAL,
    state TEXT NOT NULL DEFAULT 'idle' CHECK (state IN ('idle', 'pending', 'done', 'failed')),
    backfill_id INTEGER,
    planned_chunk INTEGER,
    backfill_rank INTEGER,
    committed_chunk INTEGER,
    failure TEXT
);
CREATE INDEX items_queue ON items (state, planned_chunk, backfill_rank);
CREATE TABLE backfills (
    id INTEGER PRIMARY KEY,
    source_space TEXT NOT NULL REFERENCES spaces(name),
    target_space TEXT NOT NULL REFERENCES spaces(name),
    method TEXT NOT NULL,
    policy TEXT NOT NULL,
    chunk_size INTEGER NOT NULL,
    total INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('running', 'complete')),
    started_at REAL NOT NULL,
    finished_at REAL
);
CREATE TABLE chunk_log (
    backfill_id INTEGER NOT NULL REFERENCES backfills(id),
    chunk INTEGER NOT NULL,
    items INTEGER NOT NULL,
    written INTEGER NOT NULL,
    failed INTEGER NOT NULL,
    vectors_sha256 TEXT NOT NULL,
    committed_at REAL NOT NULL,
    PRIMARY KEY (backfill_id, chunk)
);
"""


@dataclass(frozen=True)
class ItemRow:
    """One gallery item as the backfill sees it."""

    slot: int
    item_id: str
    source_path: str
    source_index: int
    label: int | None
    space: str


@dataclass(frozen=True)
class Backfill:
    id: int
    source_space: str
    target_space: str
    method: str
    policy: str
    chunk_size: int
    total: int
    status: str
    started_at: float
    finished_at: float | None


@dataclass(frozen=True)
class Chunk:
    backfill_id: int
    index: int
    items: tuple[ItemRow, ...]

    @property
    def slots(self) -> np.ndarray:
        return np.fromiter((item.slot for item in self.items), dtype=np.int64, count=len(self.items))


@dataclass(frozen=True)
class ChunkCommit:
    """A computed chunk ready to commit: the slots written (rows already durable) and the failures."""

    chunk: Chunk
    written: np.ndarray
    failures: dict[int, str]
    vectors_sha256: str


@dataclass(frozen=True)
class Snapshot:
    """A consistent view of which space serves each item, taken in one read transaction."""

    slots: np.ndarray
    item_ids: np.ndarray
    spaces: np.ndarray
    serving_space: str | None
    active_backfill: Backfill | None
    commit_counter: int

    def __len__(self) -> int:
        return len(self.slots)

    def partitions(self) -> dict[str, np.ndarray]:
        """Positions (into ``slots``) of the items held by each space."""
        return {str(space): np.flatnonzero(self.spaces == space) for space in np.unique(self.spaces)}


@dataclass
class ItemSources:
    """Where each ingested item came from (manifest convention: path + row index, -1 for a file)."""

    paths: Sequence[str]
    indices: Sequence[int] | None = None
    labels: Sequence[int] | None = None

    def rows(self, count: int) -> Iterator[tuple[str, int, int | None]]:
        if len(self.paths) != count:
            raise UserError(f"{len(self.paths)} source paths for {count} items")
        indices = self.indices if self.indices is not None else [-1] * count
        labels: Sequence[int | None] = self.labels if self.labels is not None else [None] * count
        if len(indices) != count or len(labels) != count:
            raise UserError(f"source indices/labels do not match the {count} items")
        for path, index, label in zip(self.paths, indices, labels, strict=True):
            yield str(path), int(index), None if label is None else int(label)


@dataclass
class StoreStatus:
    path: str
    schema_version: int
    items: int
    serving_space: str | None
    spaces: dict[str, dict[str, Any]]
    by_space: dict[str, int]
    by_state: dict[str, int]
    backfill: dict[str, Any] | None
    failed: list[dict[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "schema_version": self.schema_version,
            "items": self.items,
            "serving_space": self.serving_space,
            "spaces": self.spaces,
            "items_by_space": self.by_space,
            "items_by_state": self.by_state,
            "backfill": self.backfill,
            "failed": self.failed,
        }


class _VectorFile:
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
                    f"vector file {self.path} holds {rows} rows, the item table needs {rows_needed}",
                    hint="the store directory is damaged or was copied while a writer ran; rebuild it",
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


class GalleryStore:
    """An open gallery store. Thread-safe: one SQLite connection behind a lock."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self._db = connection
        self._lock = threading.RLock()
        self._vector_files: dict[str, _VectorFile] = {}

    # ----- opening --------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | os.PathLike[str]) -> GalleryStore:
        path = Path(path)
        if (path / DATABASE_FILE).exists():
            raise UserError(f"a gallery store already exists at {path}", hint="open it, or choose another directory")
        if path.exists() and any(path.iterdir()):
            raise UserError(f"{path} exists and is not empty", hint="a new store needs an empty or absent directory")
        (path / VECTORS_DIR).mkdir(parents=True, exist_ok=True)
        tmp_db = path / f".{DATABASE_FILE}.tmp"
        tmp_db.unlink(missing_ok=True)
        connection = sqlite3.connect(tmp_db)
        connection.executescript(_SCHEMA)
        connection.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?)",
            [("schema_version", str(SCHEMA_VERSION)), ("commit_counter", "0"), ("created_at", repr(time.time()))],
        )
        connection.commit()
        connection.close()
        os.replace(tmp_db, path / DATABASE_FILE)
        return cls.open(path)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> GalleryStore:
        path = Path(path)
        database = path / DATABASE_FILE
        if not database.is_file():
            raise UserError(
                f"no gallery store at {path} ({DATABASE_FILE} is missing)",
                hint="create one with `modelupgrade store-ingest` (or stages.demo_store)",
            )
        connection = sqlite3.connect(database, timeout=60.0, isolation_level=None, check_same_thread=False)
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
            connection.execute("PRAGMA foreign_keys=ON")
            connection.execute("PRAGMA busy_timeout=60000")
            row = connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.DatabaseError as err:
            connection.close()
            raise UserError(f"{database} is not a readable gallery store: {err}") from None
        found = None if row is None else row[0]
        if found != str(SCHEMA_VERSION):
            connection.close()
            raise UserError(
                f"gallery store {path} has schema version {found}, this modelupgrade reads version {SCHEMA_VERSION}",
                hint="rebuild the store with this version (`modelupgrade store-ingest`), or use the "
                "modelupgrade release that wrote it",
            )
        return cls(path, connection)

    def close(self) -> None:
        with self._lock:
            for vector_file in self._vector_files.values():
                vector_file.close()
            self._db.close()

    def __enter__(self) -> GalleryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN")
            try:
                yield self._db
            finally:
                self._db.execute("COMMIT")

    # ----- spaces -----------------------------------------------------------------------------
    def spaces(self) -> dict[str, SpaceSpec]:
        with self._lock:
            rows = self._db.execute(
                "SELECT name, dim, upgrades_from, backward_compatible, model_ref FROM spaces"
            ).fetchall()
        return {
            name: SpaceSpec(name, dim, tuple(json.loads(parents)), bool(compatible), model_ref)
            for name, dim, parents, compatible, model_ref in rows
        }

    def space(self, name: str) -> SpaceSpec:
        spaces = self.spaces()
        if name not in spaces:
            raise UserError(
                f"the store at {self.path} has no embedding space {name!r}",
                hint=f"its spaces are: {', '.join(sorted(spaces)) or 'none'}",
            )
        return spaces[name]

    def add_space(self, spec: SpaceSpec) -> SpaceSpec:
        """Register ``spec`` (idempotent for an identical spec; a conflicting one is an error)."""
        existing = self.spaces().get(spec.name)
        if existing is not None:
            if existing.dim != spec.dim:
                raise UserError(
                    f"embedding space {spec.name!r} already exists in the store with dimension "
                    f"{existing.dim}, not {spec.dim}",
                    hint="a model version has one embedding size; check that the right model was given",
                )
            return existing
        capacity = self.item_count()
        self._vector_file(spec).ensure_rows(capacity)
        with self._write() as db:
            db.execute(
                "INSERT INTO spaces VALUES (?, ?, ?, ?, ?, ?)",
                (spec.name, spec.dim, json.dumps(list(spec.upgrades_from)), int(spec.backward_compatible),
                 spec.model_ref, time.time()),
            )
        return spec

    def _vector_file(self, spec: SpaceSpec) -> _VectorFile:
        with self._lock:
            vector_file = self._vector_files.get(spec.name)
            if vector_file is None:
                vector_file = _VectorFile(self.path / VECTORS_DIR / f"{spec.name}.f32", spec.dim)
                self._vector_files[spec.name] = vector_file
            return vector_file

    # ----- items --------------------------------------------------------------------------------
    def item_count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM items").fetchone()[0])

    def ingest(
        self,
        item_ids: Sequence[str],
        vectors: np.ndarray,
        space: SpaceSpec,
        sources: ItemSources | None = None,
        scores: np.ndarray | None = None,
    ) -> int:
        """Add new items whose vectors in ``space`` are known; returns the number added."""
        if self.active_backfill() is not None:
            raise UserError(
                "cannot ingest while a backfill is running",
                hint="let `modelupgrade backfill` finish (or resume it) first",
            )
        item_ids = [str(i) for i in item_ids]
        vectors = check_vectors(vectors, space, f"vectors for space {space.name!r}")
        if len(vectors) != len(item_ids):
            raise UserError(f"{len(vectors)} vectors for {len(item_ids)} item ids")
        if len(set(item_ids)) != len(item_ids):
            raise UserError("the item ids to ingest are not unique")
        if scores is not None:
            scores = np.asarray(scores, dtype=np.float64)
            if scores.shape != (len(item_ids),) or not np.isfinite(scores).all():
                raise UserError(f"ordering scores must be {len(item_ids)} finite numbers, got shape {scores.shape}")
        spec = self.add_space(space)
        source_rows = list((sources or ItemSources(paths=item_ids)).rows(len(item_ids)))
        with self._lock:
            known = {row[0] for row in self._db.execute("SELECT item_id FROM items")}
            clash = [item_id for item_id in item_ids if item_id in known]
            if clash:
                raise UserError(
                    f"{len(clash)} item id(s) are already in the store, e.g. {clash[0]!r}",
                    hint="ingest only new items; item ids are unique in a gallery",
                )
            first = self.item_count()
            capacity = first + len(item_ids)
            for other in self.spaces().values():
                self._vector_file(other).ensure_rows(capacity)
            slots = np.arange(first, capacity, dtype=np.int64)
            self._vector_file(spec).write(slots, vectors, durable=True)
            with self._write() as db:
                db.executemany(
                    "INSERT INTO items (slot, item_id, source_path, source_index, label, space, score) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        (int(slot), item_id, path, index, label, spec.name,
                         None if scores is None else float(score))
                        for slot, item_id, (path, index, label), score in zip(
                            slots, item_ids, source_rows, scores if scores is not None else [None] * len(item_ids),
                            strict=True,
                        )
                    ),
                )
                if self._meta(db, "serving_space") is None:
                    self._set_meta(db, "serving_space", spec.name)
                self._bump_counter(db)
        return len(item_ids)

    def items(self, slots: Iterable[int] | None = None) -> list[ItemRow]:
        query = "SELECT slot, item_id, source_path, source_index, label, space FROM items"
        with self._lock:
            if slots is None:
                rows = self._db.execute(query + " ORDER BY slot").fetchall()
            else:
                wanted = [int(s) for s in slots]
                rows = []
                for start in range(0, len(wanted), 900):
                    part = wanted[start : start + 900]
                    rows += self._db.execute(query + f" WHERE slot IN ({','.join('?' * len(part))})", part).fetchall()
        return [ItemRow(*row) for row in rows]

    def scores(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots, ordering scores; NaN where none was stored) of every item, by slot."""
        with self._lock:
            rows = self._db.execute("SELECT slot, score FROM items ORDER BY slot").fetchall()
        slots = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        scores = np.fromiter((np.nan if r[1] is None else r[1] for r in rows), dtype=np.float64, count=len(rows))
        return slots, scores

    def read_vectors(self, space: str, slots: np.ndarray) -> np.ndarray:
        return self._vector_file(self.space(space)).read(np.asarray(slots, dtype=np.int64))

    def write_vectors(self, space: str, slots: np.ndarray, vectors: np.ndarray, durable: bool = True) -> None:
        """Write rows into their slots of ``space``; nothing points at them until a commit does."""
        spec = self.space(space)
        vectors = check_vectors(vectors, spec, f"vectors for space {space!r}")
        slots = np.asarray(slots, dtype=np.int64)
        if len(slots) != len(vectors):
            raise ValueError(f"{len(vectors)} vectors for {len(slots)} slots")
        self._vector_file(spec).write(slots, vectors, durable)

    def sync_vectors(self, space: str) -> None:
        self._vector_file(self.space(space)).sync()

    # ----- snapshots ------------------------------------------------------------------------------
    def commit_counter(self) -> int:
        with self._lock:
            return int(self._meta(self._db, "commit_counter") or 0)

    def snapshot(self) -> Snapshot:
        with self._read() as db:
            rows = db.execute("SELECT slot, item_id, space FROM items ORDER BY slot").fetchall()
            serving = self._meta(db, "serving_space")
            counter = int(self._meta(db, "commit_counter") or 0)
            backfill = self._active_backfill(db)
        return Snapshot(
            slots=np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)),
            item_ids=np.array([r[1] for r in rows], dtype=object),
            spaces=np.array([r[2] for r in rows], dtype=object),
            serving_space=serving,
            active_backfill=backfill,
            commit_counter=counter,
        )

    # ----- backfills ------------------------------------------------------------------------------
    def active_backfill(self) -> Backfill | None:
        with self._lock:
            return self._active_backfill(self._db)

    def last_backfill(self) -> Backfill | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM backfills ORDER BY id DESC LIMIT 1").fetchone()
        return None if row is None else Backfill(*row)

    @staticmethod
    def _active_backfill(db: sqlite3.Connection) -> Backfill | None:
        row = db.execute("SELECT * FROM backfills WHERE status = 'running' ORDER BY id DESC LIMIT 1").fetchone()
        return None if row is None else Backfill(*row)

    def plan_backfill(
        self, target: SpaceSpec, method: str, policy_name: str, order: np.ndarray, chunk_size: int
    ) -> Backfill:
        """Queue every item not yet in ``target``, in ``order`` (slots), cut into fixed chunks.

        The plan is written in one transaction, so chunk membership never changes afterwards: a
        resumed job redoes exactly the chunk it was working on.
        """
        if chunk_size < 1:
            raise UserError(f"chunk_size must be ≥ 1, got {chunk_size}")
        spec = self.add_space(target)
        with self._write() as db:
            if self._active_backfill(db) is not None:
                raise UserError("a backfill is already running in this store", hint="resume it instead")
            failed = db.execute("SELECT COUNT(*) FROM items WHERE state = 'failed'").fetchone()[0]
            if failed:
                raise UserError(
                    f"{failed} item(s) failed in the previous backfill and are still in their old space",
                    hint="retry them first (`modelupgrade backfill --retry-failed`)",
                )
            rows = db.execute("SELECT slot, space FROM items WHERE space != ?", (spec.name,)).fetchall()
            sources = sorted({space for _, space in rows})
            if not rows:
                raise UserError(f"every item of the store is already in space {spec.name!r}; nothing to backfill")
            if len(sources) > 1:
                raise UserError(
                    f"the items to backfill are spread over several spaces ({', '.join(sources)})",
                    hint="finish the earlier backfill before starting another",
                )
            source = sources[0]
            if not spec.can_replace(source):
                raise UserError(
                    f"model {spec.name!r} is not compatible with the store: the store's vectors are in "
                    f"space {source!r}, but {spec.name!r} upgrades from "
                    f"{', '.join(spec.upgrades_from) or 'no earlier generation'}",
                    hint=f"backfill with a model trained to upgrade {source!r}, or upgrade the store "
                    "through the generations in between first",
                )
            to_move = {slot for slot, _ in rows}
            order = np.asarray(order, dtype=np.int64)
            if len(order) != len(to_move) or set(order.tolist()) != to_move:
                raise ValueError("the backfill order must list every item to backfill exactly once")
            cursor = db.execute(
                "INSERT INTO backfills (source_space, target_space, method, policy, chunk_size, total, status, "
                "started_at) VALUES (?, ?, ?, ?, ?, ?, 'running', ?)",
                (source, spec.name, method, policy_name, chunk_size, len(order), time.time()),
            )
            backfill_id = int(cursor.lastrowid)
            db.executemany(
                "UPDATE items SET state = 'pending', backfill_id = ?, planned_chunk = ?, backfill_rank = ?, "
                "committed_chunk = NULL, failure = NULL WHERE slot = ?",
                ((backfill_id, rank // chunk_size, rank, int(slot)) for rank, slot in enumerate(order)),
            )
            db.execute("UPDATE items SET state = 'idle' WHERE space = ?", (spec.name,))
            self._set_meta(db, "serving_space", spec.name)
            self._bump_counter(db)
            return self._active_backfill(db)  # type: ignore[return-value]

    def retry_failed(self) -> Backfill:
        """Re-queue the failed items of the last backfill as new chunks after its last one."""
        with self._write() as db:
            last = db.execute("SELECT * FROM backfills ORDER BY id DESC LIMIT 1").fetchone()
            if last is None:
                raise UserError("this store has never been backfilled; there is nothing to retry")
            backfill = Backfill(*last)
            failed = [r[0] for r in db.execute(
                "SELECT slot FROM items WHERE state = 'failed' ORDER BY backfill_rank"
            )]
            if not failed:
                raise UserError("no failed items to retry")
            next_chunk = int(db.execute(
                "SELECT COALESCE(MAX(planned_chunk), -1) + 1 FROM items WHERE backfill_id = ?", (backfill.id,)
            ).fetchone()[0])
            db.executemany(
                "UPDATE items SET state = 'pending', planned_chunk = ?, committed_chunk = NULL, failure = NULL "
                "WHERE slot = ?",
                ((next_chunk + i // backfill.chunk_size, slot) for i, slot in enumerate(failed)),
            )
            db.execute("UPDATE backfills SET status = 'running', finished_at = NULL WHERE id = ?", (backfill.id,))
            self._bump_counter(db)
            return self._active_backfill(db)  # type: ignore[return-value]

    def next_chunk(self, backfill: Backfill, after: int = -1) -> Chunk | None:
        """The first planned chunk after chunk ``after`` that still has pending items, or None."""
        chunks = self.next_chunks(backfill, after, limit=1)
        return chunks[0] if chunks else None

    def next_chunks(self, backfill: Backfill, after: int = -1, limit: int = 1) -> list[Chunk]:
        """Up to ``limit`` planned chunks after chunk ``after`` that still have pending items, in
        order, read in one transaction (a job reads ahead rather than wait on each commit)."""
        with self._read() as db:
            indexes = [row[0] for row in db.execute(
                "SELECT DISTINCT planned_chunk FROM items WHERE state = 'pending' AND backfill_id = ? "
                "AND planned_chunk > ? ORDER BY planned_chunk LIMIT ?",
                (backfill.id, after, limit),
            )]
            if not indexes:
                return []
            rows = db.execute(
                "SELECT planned_chunk, slot, item_id, source_path, source_index, label, space FROM items "
                "WHERE state = 'pending' AND backfill_id = ? AND planned_chunk BETWEEN ? AND ? "
                "ORDER BY planned_chunk, backfill_rank",
                (backfill.id, indexes[0], indexes[-1]),
            ).fetchall()
        by_chunk: dict[int, list[ItemRow]] = {index: [] for index in indexes}
        for planned_chunk, *item in rows:
            by_chunk[planned_chunk].append(ItemRow(*item))
        return [Chunk(backfill.id, index, tuple(items)) for index, items in by_chunk.items()]

    def commit_chunk(
        self, chunk: Chunk, target_space: str, written: np.ndarray, failures: dict[int, str], vectors_sha256: str
    ) -> None:
        """Point the chunk's written items at ``target_space`` and record failures, atomically.

        The caller has made the written rows durable first. The chunk log's primary key makes a
        second commit of the same chunk impossible.
        """
        self.commit_chunks(target_space, [ChunkCommit(chunk, written, failures, vectors_sha256)])

    def commit_chunks(self, target_space: str, commits: Sequence[ChunkCommit]) -> None:
        """Commit several chunks in one transaction (a group commit): all of them or none.

        One transaction, hence one WAL sync, for a run of chunks whose rows the caller made durable
        with one vector sync: what lets a backfill keep up when its ψ is cheaper than a sync.
        """
        for commit in commits:
            written = {int(s) for s in commit.written}
            expected = {item.slot for item in commit.chunk.items}
            if written | set(commit.failures) != expected or written & set(commit.failures):
                raise ValueError("a chunk commit must account for every item of the chunk exactly once")
        if not commits:
            return
        with self._write() as db:
            for commit in commits:
                chunk, expected = commit.chunk, sorted(item.slot for item in commit.chunk.items)
                still_pending = db.execute(
                    f"SELECT COUNT(*) FROM items WHERE state = 'pending' AND slot IN ({','.join('?' * len(expected))})",
                    expected,
                ).fetchone()[0]
                if still_pending != len(expected):
                    raise RuntimeError(f"chunk {chunk.index} of backfill {chunk.backfill_id} was already committed")
                db.execute(
                    "INSERT INTO chunk_log VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (chunk.backfill_id, chunk.index, len(expected), len(commit.written), len(commit.failures),
                     commit.vectors_sha256, time.time()),
                )
                db.executemany(
                    "UPDATE items SET space = ?, state = 'done', committed_chunk = ? WHERE slot = ?",
                    ((target_space, chunk.index, int(slot)) for slot in commit.written),
                )
                db.executemany(
                    "UPDATE items SET state = 'failed', failure = ?, committed_chunk = ? WHERE slot = ?",
                    ((reason, chunk.index, slot) for slot, reason in commit.failures.items()),
                )
            self._bump_counter(db)

    def finish_backfill(self, backfill: Backfill) -> bool:
        """Mark ``backfill`` complete if nothing is pending; True when it is."""
        with self._write() as db:
            pending = db.execute(
                "SELECT COUNT(*) FROM items WHERE state = 'pending' AND backfill_id = ?", (backfill.id,)
            ).fetchone()[0]
            if pending:
                return False
            db.execute(
                "UPDATE backfills SET status = 'complete', finished_at = ? WHERE id = ? AND status = 'running'",
                (time.time(), backfill.id),
            )
            self._bump_counter(db)
        return True

    def failed_items(self) -> list[dict[str, str]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT item_id, failure FROM items WHERE state = 'failed' ORDER BY backfill_rank"
            ).fetchall()
        return [{"item_id": item_id, "reason": reason} for item_id, reason in rows]

    def chunk_log(self, backfill_id: int | None = None) -> list[dict[str, Any]]:
        query = "SELECT backfill_id, chunk, items, written, failed, vectors_sha256, committed_at FROM chunk_log"
        with self._lock:
            if backfill_id is None:
                rows = self._db.execute(query + " ORDER BY backfill_id, chunk").fetchall()
            else:
                rows = self._db.execute(query + " WHERE backfill_id = ? ORDER BY chunk", (backfill_id,)).fetchall()
        keys = ("backfill_id", "chunk", "items", "written", "failed", "vectors_sha256", "committed_at")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def item_states(self) -> list[dict[str, Any]]:
        """Every item's id, space, state and committing chunk (for audits and tests)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT slot, item_id, space, state, backfill_id, committed_chunk, failure FROM items ORDER BY slot"
            ).fetchall()
        keys = ("slot", "item_id", "space", "state", "backfill_id", "committed_chunk", "failure")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def status(self) -> StoreStatus:
        with self._read() as db:
            items = int(db.execute("SELECT COUNT(*) FROM items").fetchone()[0])
            by_space = dict(db.execute("SELECT space, COUNT(*) FROM items GROUP BY space").fetchall())
            by_state = dict(db.execute("SELECT state, COUNT(*) FROM items GROUP BY state").fetchall())
            serving = self._meta(db, "serving_space")
            last = db.execute("SELECT * FROM backfills ORDER BY id DESC LIMIT 1").fetchone()
            backfill_info = None
            if last is not None:
                backfill = Backfill(*last)
                done = db.execute(
                    "SELECT COUNT(*) FROM items WHERE backfill_id = ? AND state = 'done'", (backfill.id,)
                ).fetchone()[0]
                failed = db.execute(
                    "SELECT COUNT(*) FROM items WHERE backfill_id = ? AND state = 'failed'", (backfill.id,)
                ).fetchone()[0]
                chunks = db.execute("SELECT COUNT(*) FROM chunk_log WHERE backfill_id = ?", (backfill.id,)).fetchone()[0]
                backfill_info = {
                    "id": backfill.id,
                    "source_space": backfill.source_space,
                    "target_space": backfill.target_space,
                    "method": backfill.method,
                    "policy": backfill.policy,
                    "chunk_size": backfill.chunk_size,
                    "status": backfill.status,
                    "total": backfill.total,
                    "done": int(done),
                    "failed": int(failed),
                    "pending": int(backfill.total - done - failed),
                    "fraction_done": float(done / backfill.total) if backfill.total else 1.0,
                    "chunks_committed": int(chunks),
                    "started_at": backfill.started_at,
                    "finished_at": backfill.finished_at,
                }
        spaces = {
            name: {"dim": s.dim, "upgrades_from": list(s.upgrades_from), "backward_compatible": s.backward_compatible,
                   "model_ref": s.model_ref}
            for name, s in self.spaces().items()
        }
        return StoreStatus(
            path=str(self.path), schema_version=SCHEMA_VERSION, items=items, serving_space=serving, spaces=spaces,
            by_space=by_space, by_state=by_state, backfill=backfill_info, failed=self.failed_items(),
        )

    # ----- meta ---------------------------------------------------------------------------------
    @staticmethod
    def _meta(db: sqlite3.Connection, key: str) -> str | None:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    @staticmethod
    def _set_meta(db: sqlite3.Connection, key: str, value: str) -> None:
        db.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                   (key, value))

    def _bump_counter(self, db: sqlite3.Connection) -> None:
        db.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'commit_counter'")


def check_vectors(vectors: np.ndarray, space: SpaceSpec, what: str) -> np.ndarray:
    """``vectors`` as contiguous float32 (N, dim of ``space``), or a UserError saying what is wrong."""
    array = np.asarray(vectors)
    if array.ndim != 2:
        raise UserError(f"{what} must be a 2-D array (N, D), got shape {array.shape}")
    if array.shape[1] != space.dim:
        raise UserError(
            f"{what} have dimension {array.shape[1]}, but space {space.name!r} holds {space.dim}-d vectors",
            hint="the vectors must come from the model version the space is named after",
        )
    array = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(array).all():
        raise UserError(f"{what} contain NaN or infinite values")
    return array
