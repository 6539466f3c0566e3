"""The gallery store: items, their embedding spaces and ordering scores, and their vectors.

``GalleryStore`` keeps its items, scores and backfill ledger in an SQLite database
(``modelupgrade.store.schema``) and its vectors in the vector backend it was created with
(``modelupgrade.store.backends``: embedded float32 files by default, or Milvus). Its backfill state
machine is ``store.backfills`` (``modelupgrade.store.ledger``); a consistent view for searching is
``snapshot()``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Self

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.ordering.scores import score_kind_of
from modelupgrade.store.backends import VECTOR_BACKENDS, BackendSettings, VectorBackend
from modelupgrade.store.backends.base import BACKEND_META
from modelupgrade.store.database import Database
from modelupgrade.store.ledger import BackfillLedger
from modelupgrade.store.lock import WriterLock, writes
from modelupgrade.store.schema import ITEM_COLUMNS, ItemRow, ItemSources, Snapshot
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
        self.writer = WriterLock(self.path)
        with self.db.lock:
            meta = {key: Database.meta(self.db.connection, key) for key in BACKEND_META}
        self.backend_settings = BackendSettings.from_meta(meta)
        # Opened on first use: a process that only reads the ledger never connects to Milvus.
        self.vectors: VectorBackend = VECTOR_BACKENDS.get(self.backend_settings.kind)(
            self.path, self.backend_settings
        )

    # ----- opening --------------------------------------------------------------------------
    @classmethod
    def create(
        cls, path: str | os.PathLike[str], backend: BackendSettings | None = None
    ) -> GalleryStore:
        """A new, empty store at ``path`` whose vectors live in ``backend`` (default: embedded)."""
        settings = backend or BackendSettings()
        settings = VECTOR_BACKENDS.get(settings.kind).prepared(Path(path), settings)
        Database.create(Path(path))
        database = Database.open(Path(path))
        with database.write() as db:
            for key, value in settings.as_meta().items():
                Database.set_meta(db, key, value)
        return cls(database)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> GalleryStore:
        store = cls(Database.open(Path(path)))
        store._recover_if_left()
        return store

    def close(self) -> None:
        with self.db.lock:
            self.vectors.close()
            self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def writing(self, operation: str) -> Iterator[None]:
        """Hold the store's writer lock for the block: one writing process at a time
        (``modelupgrade.store.lock``); ``operation`` is what a refused writer is told it does.

        Taking the lock first redoes what a writer that crashed left in the vector backend's
        journal; letting go of it checkpoints what this one wrote (``VectorBackend.recover`` and
        ``checkpoint``). A block that raises leaves its journal for the next writer to redo.
        """
        outermost = not self.writer.held
        with self.writer.hold(operation):
            if outermost:
                self.vectors.recover()
            yield
            if outermost:
                self.vectors.checkpoint()

    def _recover_if_left(self) -> None:
        """A writer that crashed (or lost power) before its checkpoint left vectors in the journal
        that committed items may point at: redo them before anything reads, unless a writer holds
        the store (it redid them when it took it)."""
        if not self.vectors.journals_left():
            return
        try:
            with self.writing("recover the vectors a crashed writer left"):
                pass
        except (UserError, OSError):
            pass

    # ----- spaces -----------------------------------------------------------------------------
    def spaces(self) -> dict[str, SpaceSpec]:
        rows = self.db.query(
            "SELECT name, dim, upgrades_from, backward_compatible, model_ref, form FROM spaces"
        )
        return {
            name: SpaceSpec(
                name, dim, tuple(json.loads(parents)), bool(compatible), model_ref, form
            )
            for name, dim, parents, compatible, model_ref, form in rows
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
        existing = self.registered(spec)
        if existing is not None:
            return existing
        # A file of a space the database does not know is a leftover (of an aborted backfill, or
        # of a crash before the space's row committed); nothing points at its rows.
        self.discard_vectors(spec.name)
        self.vectors.add_space(spec, self.item_count())
        with self.db.write() as db:
            db.execute(
                "INSERT INTO spaces VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    spec.name,
                    spec.dim,
                    json.dumps(list(spec.upgrades_from)),
                    int(spec.backward_compatible),
                    spec.model_ref,
                    spec.form,
                    time.time(),
                ),
            )
        return spec

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

    def discard_vectors(self, name: str) -> None:
        """Delete the vector file of space ``name``, which no item and no space row may name."""
        with self.db.lock:
            if name in self.spaces():
                raise RuntimeError(f"space {name!r} is still registered; its vectors stay")
            self.vectors.discard(name)

    # ----- items --------------------------------------------------------------------------------
    def item_count(self) -> int:
        return int(self.db.query("SELECT COUNT(*) FROM items")[0][0])

    @writes("ingest")
    def ingest(
        self,
        item_ids: Sequence[str],
        vectors: np.ndarray,
        space: SpaceSpec,
        sources: ItemSources | None = None,
        scores: Mapping[str, np.ndarray] | None = None,
    ) -> int:
        """Add new items whose vectors in ``space`` are known; returns the number added.

        ``scores`` maps an ordering score kind (``modelupgrade.ordering.SCORE_KINDS``) to one value
        per item. Every item of a store carries the same kinds, so the first ingest decides them.
        """
        if self.backfills.active() is not None:
            raise UserError(
                "cannot ingest while a backfill is running",
                hint="let `modelupgrade backfill` finish (or resume it) first",
            )
        item_ids = [str(i) for i in item_ids]
        vectors = check_vectors(vectors, space, f"vectors for space {space.name!r}")
        if len(vectors) != len(item_ids):
            raise UserError(f"{len(vectors)} vectors for {len(item_ids)} item ids")
        if len(set(item_ids)) != len(item_ids):
            repeated = next(i for i, count in Counter(item_ids).items() if count > 1)
            raise UserError(
                f"the item ids to ingest are not unique, e.g. {repeated!r} appears more than once",
                hint="an item id names one gallery item; drop or rename the repeated rows",
            )
        checked_scores = self._checked_scores(scores or {}, len(item_ids))
        source_rows = list((sources or ItemSources(paths=item_ids)).rows(len(item_ids)))
        with self.db.lock:
            # Every check before the first write: a refused ingest leaves the store as it was.
            known = {row[0] for row in self.db.query("SELECT item_id FROM items")}
            clash = [item_id for item_id in item_ids if item_id in known]
            if clash:
                raise UserError(
                    f"{len(clash)} item id(s) are already in the store, e.g. {clash[0]!r}",
                    hint="ingest only new items; item ids are unique in a gallery",
                )
            spec = self.add_space(space)
            first = self.item_count()
            capacity = first + len(item_ids)
            self.vectors.reserve(list(self.spaces().values()), capacity)
            slots = np.arange(first, capacity, dtype=np.int64)
            self.vectors.write(spec, slots, vectors, vector_checksums(vectors))
            self.vectors.sync(spec)  # the rows are stored before anything points at them
            with self.db.write() as db:
                db.executemany(
                    "INSERT INTO items (slot, item_id, source_path, source_index, label, space) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        (int(slot), item_id, path, index, label, spec.name)
                        for slot, item_id, (path, index, label) in zip(
                            slots, item_ids, source_rows, strict=True
                        )
                    ),
                )
                for kind, values in checked_scores.items():
                    db.execute(
                        "INSERT OR IGNORE INTO score_kinds VALUES (?, ?, ?)",
                        (kind, score_kind_of(kind).meaning, time.time()),
                    )
                    db.executemany(
                        "INSERT INTO item_scores VALUES (?, ?, ?)",
                        (
                            (kind, int(slot), float(value))
                            for slot, value in zip(slots, values, strict=True)
                        ),
                    )
                if Database.meta(db, "serving_space") is None:
                    Database.set_meta(db, "serving_space", spec.name)
        return len(item_ids)

    def _checked_scores(
        self, scores: Mapping[str, np.ndarray], count: int
    ) -> dict[str, np.ndarray]:
        checked: dict[str, np.ndarray] = {}
        for kind, values in scores.items():
            if not score_kind_of(kind).deployable:
                raise UserError(
                    f"the {kind!r} score needs every item's new vector, so no store can hold "
                    "it before its backfill",
                    hint="store a score computed from the stored vectors (old-confidence, "
                    "old-entropy, fastfill-sigma2)",
                )
            values = np.asarray(values, dtype=np.float64)
            if values.shape != (count,) or not np.isfinite(values).all():
                raise UserError(
                    f"{kind!r} scores must be {count} finite numbers, got shape {values.shape}"
                )
            checked[kind] = values
        held = set(self.score_kinds())
        if self.item_count() and set(checked) != held:
            raise UserError(
                f"every item of this store carries the scores {sorted(held) or 'none'}; the new "
                f"items come with {sorted(checked) or 'none'}",
                hint="ingest them with the same ordering scores (--score) as the "
                "items already stored",
            )
        return checked

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
        rows = self.db.query(
            "SELECT slot, value FROM item_scores WHERE kind = ? ORDER BY slot", (kind,)
        )
        table = np.full(self.item_count(), np.nan)
        for slot, value in rows:
            table[slot] = value
        return table[np.asarray(slots, dtype=np.int64)]

    # ----- vectors ------------------------------------------------------------------------------
    def read_vectors(self, space: str, slots: np.ndarray) -> np.ndarray:
        return self.vectors.read(self.space(space), np.asarray(slots, dtype=np.int64))

    def write_vectors(
        self, space: str, slots: np.ndarray, vectors: np.ndarray, durable: bool = True
    ) -> None:
        """Write rows, each with its checksum, into their slots of ``space``; nothing points at them
        until a commit does."""
        spec = self.space(space)
        vectors = check_vectors(vectors, spec, f"vectors for space {space!r}")
        slots = np.asarray(slots, dtype=np.int64)
        if len(slots) != len(vectors):
            raise ValueError(f"{len(vectors)} vectors for {len(slots)} slots")
        if len(slots):
            self.vectors.write(spec, slots, vectors, vector_checksums(vectors))
            if durable:
                self.vectors.sync(spec)

    def sync_vectors(self, space: str) -> None:
        self.vectors.sync(self.space(space))

    def provenance(self, space: str, slots: np.ndarray) -> list[dict[str, object]]:
        """What is recorded with each stored vector of ``slots`` in ``space``: its space, the model
        that produced it and its checksum (None where the store recorded none)."""
        spec = self.space(space)
        slots = np.asarray(slots, dtype=np.int64)
        sums = self.vectors.checksums(spec, slots)
        return [
            {
                "slot": int(slot),
                "space": recorded_space,
                "model_ref": model_ref,
                "checksum": None if checksum == UNRECORDED else f"{int(checksum):016x}",
            }
            for slot, (recorded_space, model_ref), checksum in zip(
                slots, self.vectors.provenance(spec, slots), sums, strict=True
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
        stored = self.vectors.checksums(spec, slots)
        recomputed = vector_checksums(self.vectors.read(spec, slots))
        bad = np.flatnonzero((stored != UNRECORDED) & (stored != recomputed))
        wrong_space = [
            int(slot)
            for slot, (recorded, _) in zip(slots, self.vectors.provenance(spec, slots), strict=True)
            if recorded != space
        ]
        if len(bad) or wrong_space:
            example = int(slots[bad[0]]) if len(bad) else wrong_space[0]
            raise UserError(
                f"{len(bad) + len(wrong_space)} stored vector(s) of space {space!r} do not match "
                f"what was recorded when they were written, e.g. slot {example}",
                hint="the vector storage was changed outside modelupgrade; backfill the items "
                "again from their source or rebuild the store",
            )
        return len(slots)

    # ----- snapshots ------------------------------------------------------------------------------
    def commit_counter(self) -> int:
        return self.db.commit_counter()

    def serving_space(self) -> str | None:
        with self.db.lock:
            return Database.meta(self.db.connection, "serving_space")

    def snapshot(self) -> Snapshot:
        with self.db.read() as db:
            rows = db.execute(
                "SELECT slot, item_id, space FROM current_items ORDER BY slot"
            ).fetchall()
            serving = Database.meta(db, "serving_space")
            counter = int(Database.meta(db, "commit_counter") or 0)
            backfill = BackfillLedger.active_in(db)
        return Snapshot(
            slots=np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)),
            item_ids=np.array([r[1] for r in rows], dtype=object),
            spaces=np.array([r[2] for r in rows], dtype=object),
            serving_space=serving,
            active_backfill=backfill,
            commit_counter=counter,
        )

    def status(self) -> StoreStatus:
        status = read_status(self.db, self.spaces())
        status.vectors = self.vectors.describe()
        status.index = self.backend_settings.index.model_dump()
        return status
