"""The gallery store: items, their embedding spaces and ordering scores, and the vectors on disk.

``GalleryStore`` is the embedded store: an SQLite item table plus one float32 file per space
(``modelupgrade.store.schema``). Its backfill state machine is ``store.backfills``
(``modelupgrade.store.ledger``); a consistent view for searching is ``snapshot()``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Self

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.ordering.scores import score_kind_of
from modelupgrade.store.database import Database
from modelupgrade.store.ledger import BackfillLedger
from modelupgrade.store.schema import ITEM_COLUMNS, VECTORS_DIR, ItemRow, ItemSources, Snapshot
from modelupgrade.store.spaces import SpaceSpec
from modelupgrade.store.status import StoreStatus, read_status
from modelupgrade.store.vectors import VectorFile, check_vectors

log = logging.getLogger(__name__)


class GalleryStore:
    """An open gallery store. Thread-safe: one SQLite connection behind a lock."""

    def __init__(self, database: Database) -> None:
        self.db = database
        self.path = database.path
        self.backfills = BackfillLedger(database)
        self._vector_files: dict[str, VectorFile] = {}

    # ----- opening --------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | os.PathLike[str]) -> GalleryStore:
        Database.create(Path(path))
        return cls.open(path)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> GalleryStore:
        return cls(Database.open(Path(path)))

    def close(self) -> None:
        with self.db.lock:
            for vector_file in self._vector_files.values():
                vector_file.close()
            self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
            return existing
        self._vector_file(spec).ensure_rows(self.item_count())
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

    def _vector_file(self, spec: SpaceSpec) -> VectorFile:
        with self.db.lock:
            vector_file = self._vector_files.get(spec.name)
            if vector_file is None:
                vector_file = VectorFile(self.path / VECTORS_DIR / f"{spec.name}.f32", spec.dim)
                self._vector_files[spec.name] = vector_file
            return vector_file

    # ----- items --------------------------------------------------------------------------------
    def item_count(self) -> int:
        return int(self.db.query("SELECT COUNT(*) FROM items")[0][0])

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
            raise UserError("the item ids to ingest are not unique")
        checked_scores = self._checked_scores(scores or {}, len(item_ids))
        source_rows = list((sources or ItemSources(paths=item_ids)).rows(len(item_ids)))
        spec = self.add_space(space)
        with self.db.lock:
            known = {row[0] for row in self.db.query("SELECT item_id FROM items")}
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
        query = f"SELECT {ITEM_COLUMNS} FROM items"
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
        return self._vector_file(self.space(space)).read(np.asarray(slots, dtype=np.int64))

    def write_vectors(
        self, space: str, slots: np.ndarray, vectors: np.ndarray, durable: bool = True
    ) -> None:
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
        return self.db.commit_counter()

    def serving_space(self) -> str | None:
        with self.db.lock:
            return Database.meta(self.db.connection, "serving_space")

    def snapshot(self) -> Snapshot:
        with self.db.read() as db:
            rows = db.execute("SELECT slot, item_id, space FROM items ORDER BY slot").fetchall()
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
        return read_status(self.db, self.spaces())
