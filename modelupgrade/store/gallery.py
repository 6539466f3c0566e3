"""The gallery store: items, their embedding spaces and ordering scores, and their vectors.

``GalleryStore`` keeps its items, scores and backfill ledger in an SQLite database
(``modelupgrade.store.schema``) and its vectors in the vector backend it was created with
(``modelupgrade.store.backends``: embedded float32 files by default, or Milvus). Its backfill state
machine is ``store.backfills`` (``modelupgrade.store.ledger``); a consistent view for searching is
``snapshot()``.

Writers hold its locks (``modelupgrade.store.lock``): every write step the commit lock
(``committing``), a backfill, an abort and a serving step also the writer lease (``writing``).
The first write step of a process redoes what a crashed writer left half-done
(``modelupgrade.store.recovery``). Readers take no lock and write nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.ordering.scores import score_kind_of
from modelupgrade.store.backends import VECTOR_BACKENDS, BackendSettings, VectorBackend
from modelupgrade.store.backends.base import BACKEND_META, VectorRows
from modelupgrade.store.database import Database
from modelupgrade.store.directory import existing_directory, refuse_foreign, store_directory
from modelupgrade.store.faults import boundary
from modelupgrade.store.ingest_checks import (
    check_item_ids,
    check_new_items,
    check_space_during_backfill,
    check_space_served,
    checked_ingest_scores,
    insert_items,
    insert_scores,
)
from modelupgrade.store.ledger import BackfillLedger
from modelupgrade.store.lock import (
    COMMIT_HOLDER_FILE,
    COMMIT_LOCK_FILE,
    COMMIT_WAIT_S,
    WriterLock,
    writes,
)
from modelupgrade.store.recovery import recover
from modelupgrade.store.schema import (
    DATABASE_FILE,
    ITEM_COLUMNS,
    ItemRow,
    ItemSources,
    Snapshot,
)
from modelupgrade.store.snapshots import ItemTable, read_snapshot, serving_state
from modelupgrade.store.spaces import SpaceSpec
from modelupgrade.store.status import StoreStatus, read_status
from modelupgrade.store.vectors import UNRECORDED, check_vectors, vector_checksums

log = logging.getLogger(__name__)


class GalleryStore:
    """An open gallery store. Thread-safe: one SQLite connection behind a lock."""

    def __init__(self, database: Database) -> None:
        self.db = database
        self.path = database.path
        self.backfills = BackfillLedger(database)
        self.lease = WriterLock(self.path)
        self.commit_lock = WriterLock(self.path, COMMIT_LOCK_FILE, COMMIT_HOLDER_FILE)
        self._recovered = False  # this object's first write step recovers thoroughly
        self._items: ItemTable | None = None  # the item rows a snapshot last read
        with self.db.lock:
            meta = {key: Database.meta(self.db.connection, key) for key in BACKEND_META}
        self.backend_settings = BackendSettings.from_meta(meta)
        # Opened on first use: a process that only reads the ledger never connects to Milvus.
        self.vectors: VectorBackend = VECTOR_BACKENDS.get(self.backend_settings.kind)(
            self.path, self.backend_settings
        )
        # Every commit records the newest vector write it may point at; every read of the vectors
        # waits for the newest one recorded (a Milvus server's reads are otherwise only eventually
        # consistent across processes).
        self.db.on_commit = self._record_vector_mark
        self.db.after_commit = self._publish
        self.vectors.fence = self._vector_fence

    def _publish(self) -> None:
        """Give the backend the serving state just committed, for readers that do not read this
        store's database (``serving_state``; a Milvus server keeps it beside the collections)."""
        if not self.vectors.publishes:
            return
        try:
            self.vectors.publish(serving_state(self.db, self.spaces(), self.vectors))
        except UserError as err:  # committed all the same: the next commit publishes again
            log.warning("the serving state was not published: %s", err.message)

    def _record_vector_mark(self, db: Any) -> None:
        mark = self.vectors.write_mark()
        if mark and mark > int(Database.meta(db, "vector_mark") or 0):
            Database.set_meta(db, "vector_mark", str(mark))

    def _vector_fence(self) -> int:
        rows = self.db.query("SELECT value FROM meta WHERE key = 'vector_mark'")
        return int(rows[0][0]) if rows else 0

    # ----- opening --------------------------------------------------------------------------
    @classmethod
    def create(
        cls, path: str | os.PathLike[str], backend: BackendSettings | None = None
    ) -> GalleryStore:
        """A new, empty store in the directory ``path`` (absent, or empty) whose vectors live in
        ``backend`` (default: embedded); created under the store's commit lock."""
        directory = store_directory(Path(path))
        settings = backend or BackendSettings()
        settings = VECTOR_BACKENDS.get(settings.kind).prepared(directory, settings)
        with WriterLock(directory, COMMIT_LOCK_FILE, COMMIT_HOLDER_FILE).hold(
            "create a gallery store", COMMIT_WAIT_S
        ):
            if (directory / DATABASE_FILE).exists():
                raise UserError(
                    f"a gallery store already exists at {directory}",
                    hint="open it, or choose another directory",
                )
            refuse_foreign(directory)
            return cls._created(directory, settings)

    @classmethod
    def _created(cls, directory: Path, settings: BackendSettings) -> GalleryStore:
        Database.create(directory, settings.as_meta())
        boundary("create:database")
        return cls(Database.open(directory))

    @classmethod
    def open_or_create(
        cls, path: str | os.PathLike[str], backend: BackendSettings | None = None
    ) -> tuple[GalleryStore, bool]:
        """The store at ``path``, created (under its commit lock) when the directory holds none;
        and whether it was created. Two processes that both find no store never both create one:
        the second waits for the lock and opens the first one's."""
        target = Path(path)
        if target.is_dir() and not (target / DATABASE_FILE).is_file():
            refuse_foreign(target)
        directory = store_directory(target)
        if (directory / DATABASE_FILE).is_file():
            return cls.open(directory), False
        settings = backend or BackendSettings()
        settings = VECTOR_BACKENDS.get(settings.kind).prepared(directory, settings)
        with WriterLock(directory, COMMIT_LOCK_FILE, COMMIT_HOLDER_FILE).hold(
            "create a gallery store", COMMIT_WAIT_S
        ):
            if (directory / DATABASE_FILE).is_file():
                return cls.open(directory), False
            refuse_foreign(directory)
            return cls._created(directory, settings), True

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> GalleryStore:
        """The store at ``path``, for reading (and writing: each write takes its locks)."""
        return cls(Database.open(existing_directory(Path(path))))

    def close(self) -> None:
        with self.db.lock:
            self.vectors.close()
            self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- locks --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def writing(self, operation: str) -> Iterator[None]:
        """Hold the store's writer lease for the block (``modelupgrade.store.lock``): one backfill,
        abort or serving step at a time; ``operation`` is what a refused one is told is running.
        Letting go of it checkpoints what this process wrote (``VectorBackend.checkpoint``)."""
        outermost = not self.lease.held
        with self.lease.hold(operation):
            with self.committing(operation):
                pass  # the first write step of a process redoes what a crashed writer left
            yield
            if outermost:
                with self.committing(operation):
                    self.vectors.checkpoint()

    @contextlib.contextmanager
    def committing(self, operation: str) -> Iterator[None]:
        """Hold the store's commit lock for one write step (waiting for another's a while).

        Taking it first redoes what a writer that crashed left half-done (the vector journal, the
        intents, the orphan slots: ``modelupgrade.store.recovery``); a live writer (not holding the
        lease) checkpoints its vectors when it lets go. A block that raises leaves its journal for
        the next writer to redo."""
        outermost = not self.commit_lock.held
        with self.commit_lock.hold(operation, COMMIT_WAIT_S):
            if outermost and not self.db.still_backs_the_store():
                raise UserError(
                    f"cannot {operation}: the store at {self.path} was removed or replaced "
                    "while this process had it open",
                    hint="run the command again: it opens the store that is there now",
                )
            if outermost:
                thorough = self.commit_lock.took_over or not self._recovered
                recover(self.db, self.vectors, self.spaces(), self.next_slot(), thorough)
                self._recovered = True
            yield
            if outermost and not self.lease.held:
                self.vectors.checkpoint()

    # ----- spaces -----------------------------------------------------------------------------
    def spaces(self) -> dict[str, SpaceSpec]:
        rows = self.db.query(
            "SELECT name, dim, upgrades_from, backward_compatible, model_ref, form, storage "
            "FROM spaces"
        )
        return {
            name: SpaceSpec(
                name, dim, tuple(json.loads(parents)), bool(compatible), model_ref, form, storage
            )
            for name, dim, parents, compatible, model_ref, form, storage in rows
        }

    def space(self, name: str) -> SpaceSpec:
        spaces = self.spaces()
        if name not in spaces:
            raise UserError(
                f"the store at {self.path} has no embedding space {name!r}",
                hint=f"its spaces are: {', '.join(sorted(spaces)) or 'none'}",
            )
        return spaces[name]

    @writes("add an embedding space")
    def add_space(self, spec: SpaceSpec) -> SpaceSpec:
        """Register ``spec`` (idempotent for an identical spec; a conflicting one is an error);
        returns the space as registered (with its storage)."""
        existing = self.registered(spec)
        if existing is not None:
            return existing
        taken = {space.storage for space in self.spaces().values()}

        def draw() -> int:
            with self.db.write() as db:
                return Database.take_counter(db, "next_storage")

        storage = self.vectors.storage_for(spec, draw)
        while storage in taken:  # a space of an older store holds that name
            storage = self.vectors.storage_for(spec, draw)
        registered = SpaceSpec(
            spec.name,
            spec.dim,
            spec.upgrades_from,
            spec.backward_compatible,
            spec.model_ref,
            spec.form,
            storage,
        )
        # Vectors under that storage that the database does not name are a leftover (of an aborted
        # backfill, or of a crash before the space's row committed); nothing points at them.
        self.vectors.discard(storage)
        self.vectors.add_space(registered, self.next_slot())
        with self.db.write() as db:
            db.execute(
                "INSERT INTO spaces (name, dim, upgrades_from, backward_compatible, model_ref, "
                "form, created_at, storage) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    spec.name,
                    spec.dim,
                    json.dumps(list(spec.upgrades_from)),
                    int(spec.backward_compatible),
                    spec.model_ref,
                    spec.form,
                    time.time(),
                    storage,
                ),
            )
        return registered

    def registered(self, spec: SpaceSpec) -> SpaceSpec | None:
        """The space of ``spec``'s name as the store holds it, None if it holds none; one of
        another dimension or form is an error (what ``add_space`` would refuse)."""
        existing = self.spaces().get(spec.name)
        if existing is not None:
            if existing.dim != spec.dim:
                raise UserError(
                    f"embedding space {spec.name!r} already exists in the store with dimension "
                    f"{existing.dim}, not {spec.dim}",
                    hint="a model version has one embedding size; check that the "
                    "right model was given",
                )
            if existing.form != spec.form:
                raise UserError(
                    f"embedding space {spec.name!r} holds {existing.form!r} vectors, "
                    f"not {spec.form!r} ones",
                    hint="name the space of another form differently",
                )
            if existing.model_ref and spec.model_ref and existing.model_ref != spec.model_ref:
                # Same name and size, another producer: its vectors would silently mix spaces.
                raise UserError(
                    f"embedding space {spec.name!r} holds vectors of model {existing.model_ref}, "
                    f"these come from {spec.model_ref}",
                    hint="vectors of another model are another space: give them their own "
                    "space name (--space)",
                )
        return existing

    def discard_vectors(self, storage: str) -> None:
        """Delete the vectors kept under ``storage``, which no space row may name."""
        with self.db.lock:
            if storage in {space.storage for space in self.spaces().values()}:
                raise RuntimeError(f"storage {storage!r} still holds a space; its vectors stay")
            self.vectors.discard(storage)

    # ----- items --------------------------------------------------------------------------------
    def item_count(self) -> int:
        return int(self.db.query("SELECT COUNT(*) FROM items")[0][0])

    def next_slot(self) -> int:
        """The slot the next new item gets (slots are never reused: erased ones stay empty)."""
        return int(self.db.query("SELECT value FROM meta WHERE key = 'next_slot'")[0][0])

    @writes("ingest")
    def ingest(
        self,
        item_ids: Sequence[str],
        vectors: np.ndarray,
        space: SpaceSpec,
        sources: ItemSources | None = None,
        scores: Mapping[str, np.ndarray] | None = None,
        content: np.ndarray | None = None,
    ) -> int:
        """Add new items whose vectors in ``space`` are known; returns the number added.

        ``scores`` maps an ordering score kind (``modelupgrade.ordering.SCORE_KINDS``) to one value
        per item. Every item of a store carries the same kinds, so the first ingest decides them.
        ``content`` holds each vector's source content hash (``vectors.content_hashes``; none: not
        recorded). While a backfill runs, items in its source space join it (queued after its last
        chunk, ``BackfillLedger.queue``) and items in its target space are in it at once.
        """
        item_ids = [str(i) for i in item_ids]
        vectors = check_vectors(vectors, space, f"vectors for space {space.name!r}")
        check_item_ids(item_ids, len(vectors))
        checked_scores = checked_ingest_scores(
            scores or {}, len(item_ids), set(self.score_kinds()), self.item_count() > 0
        )
        source_rows = list((sources or ItemSources(paths=item_ids)).rows(len(item_ids)))
        active = self.backfills.active()
        check_space_during_backfill(active, space.name)
        # Every check before the first write: a refused ingest leaves the store as it was.
        check_new_items(self.known_item_ids(item_ids))
        serving = self.serving_space()
        check_space_served(None if serving is None else self.space(serving), active, space.name)
        spec = self.add_space(space)
        first = self.next_slot()
        slots = np.arange(first, first + len(item_ids), dtype=np.int64)
        self.vectors.reserve(list(self.spaces().values()), first + len(item_ids))
        self.write_vectors(spec.name, slots, vectors, content=content, item_ids=item_ids)
        boundary("ingest:vectors")
        with self.db.write(items_changed=True) as db:
            taken = Database.take_counter(db, "next_slot", len(item_ids))
            if taken != first:
                raise RuntimeError(f"slot counter moved from {first} to {taken} under the lock")
            insert_items(db, slots, item_ids, source_rows, spec.name)
            insert_scores(db, slots, checked_scores)
            if Database.meta(db, "serving_space") is None:
                Database.set_meta(db, "serving_space", spec.name)
            if active is not None and spec.name == active.source_space:
                BackfillLedger.queue(db, active, slots)
        boundary("ingest:committed")
        return len(item_ids)

    def known_item_ids(self, item_ids: Sequence[str]) -> list[str]:
        """Those of ``item_ids`` the store holds (looked up by its index, not by a scan)."""
        found: list[str] = []
        for start in range(0, len(item_ids), 900):
            part = list(item_ids[start : start + 900])
            found += [
                row[0]
                for row in self.db.query(
                    f"SELECT item_id FROM items WHERE item_id IN ({','.join('?' * len(part))})",
                    part,
                )
            ]
        return found

    def items(self, slots: Iterable[int] | None = None) -> list[ItemRow]:
        query = f"SELECT {ITEM_COLUMNS} FROM current_items"
        if slots is None:
            return [ItemRow(*row) for row in self.db.query(query + " ORDER BY slot")]
        wanted = [int(s) for s in slots]
        rows = []
        for start in range(0, len(wanted), 900):
            part = wanted[start : start + 900]
            rows += self.db.query(query + f" WHERE slot IN ({','.join('?' * len(part))})", part)
        return [ItemRow(*row) for row in rows]

    # ----- ordering scores ----------------------------------------------------------------------
    def score_kinds(self) -> dict[str, str]:
        """The ordering score kinds every item carries, with what each one means."""
        return dict(self.db.query("SELECT kind, meaning FROM score_kinds ORDER BY kind"))

    def scores(self, kind: str, slots: np.ndarray) -> np.ndarray:
        """The ``kind`` score of the items in ``slots``; a kind the store does
        not hold is an error."""
        held = self.score_kinds()
        if kind not in held:
            raise UserError(
                f"this store holds no {kind!r} scores ({score_kind_of(kind).meaning}); it holds "
                f"{', '.join(sorted(held)) or 'no scores'}",
                hint=f"ingest the gallery with --score {kind}, or choose a policy that orders by a "
                "score the store holds (or 'random' / 'ingest-order', which need none)",
            )
        rows = self.db.query("SELECT slot, value FROM item_scores WHERE kind = ?", (kind,))
        table = np.full(self.next_slot(), np.nan)
        for slot, value in rows:
            table[slot] = value
        return table[np.asarray(slots, dtype=np.int64)]

    # ----- vectors ------------------------------------------------------------------------------
    def read_vectors(self, space: str, slots: np.ndarray) -> np.ndarray:
        return self.vectors.read(self.space(space), np.asarray(slots, dtype=np.int64))

    def write_vectors(
        self,
        space: str,
        slots: np.ndarray,
        vectors: np.ndarray,
        durable: bool = True,
        content: np.ndarray | None = None,
        written_by: tuple[int, int] = (0, 0),
        item_ids: Sequence[str] | None = None,
    ) -> None:
        """Write rows, each with its checksum and source content hash (``content``; none: not
        recorded), into their slots of ``space``; nothing points at them until a commit does.
        ``written_by`` is the (backfill, chunk) whose commit will."""
        spec = self.space(space)
        vectors = check_vectors(vectors, spec, f"vectors for space {space!r}")
        slots = np.asarray(slots, dtype=np.int64)
        if len(slots) != len(vectors):
            raise ValueError(f"{len(vectors)} vectors for {len(slots)} slots")
        if not len(slots):
            return
        sources = (
            np.zeros(len(slots), dtype=np.uint64)
            if content is None
            else np.asarray(content, dtype=np.uint64)
        )
        rows = VectorRows(
            slots,
            vectors,
            vector_checksums(vectors),
            sources,
            written_by,
            None if item_ids is None else tuple(str(i) for i in item_ids),
        )
        self.vectors.write(spec, rows)
        if durable:
            self.vectors.sync(spec)

    def sync_vectors(self, space: str) -> None:
        self.vectors.sync(self.space(space))

    def provenance(self, space: str, slots: np.ndarray) -> list[dict[str, object]]:
        """What is recorded with each stored vector of ``slots`` in ``space``: its space, the model
        that produced it, its checksum and the hash of the content it was made from (None where
        the store recorded none)."""
        spec = self.space(space)
        slots = np.asarray(slots, dtype=np.int64)
        sums = self.vectors.checksums(spec, slots)
        sources = self.vectors.sources(spec, slots)
        return [
            {
                "slot": int(slot),
                "space": recorded_space,
                "model_ref": model_ref,
                "checksum": None if checksum == UNRECORDED else f"{int(checksum):016x}",
                "source_hash": None if source == UNRECORDED else f"{int(source):016x}",
            }
            for slot, (recorded_space, model_ref), checksum, source in zip(
                slots, self.vectors.provenance(spec, slots), sums, sources, strict=True
            )
        ]

    def verify_vectors(self, space: str, slots: np.ndarray | None = None) -> int:
        """Check the stored vectors of ``slots`` (default: the items ``space`` holds) against the
        checksums and the space recorded with them; returns how many were checked."""
        spec = self.space(space)
        if slots is None:
            snapshot = self.snapshot()
            slots = snapshot.slots[snapshot.spaces == space]
        slots = np.asarray(slots, dtype=np.int64)
        bad = self.vectors.mismatched(spec, slots)
        if bad:
            raise UserError(
                f"{len(bad)} stored vector(s) of space {space!r} do not match what was recorded "
                f"when they were written, e.g. slot {bad[0]}",
                hint="the vector storage was changed outside modelupgrade; backfill the items "
                "again from their source or rebuild the store",
            )
        return len(slots)

    # ----- snapshots ------------------------------------------------------------------------------
    def commit_counter(self) -> int:
        return self.db.commit_counter()

    def serving_space(self) -> str | None:
        rows = self.db.query("SELECT value FROM meta WHERE key = 'serving_space'")
        return str(rows[0][0]) if rows else None

    def snapshot(self) -> Snapshot:
        """Which space serves each item now (``modelupgrade.store.snapshots``): the item rows read
        again only when they changed since the last snapshot."""
        snapshot, self._items = read_snapshot(self.db, self._items)
        return snapshot

    def status(self) -> StoreStatus:
        status = read_status(self.db, self.spaces())
        status.vectors = self.vectors.describe()
        status.index = self.backend_settings.index.model_dump()
        return status
