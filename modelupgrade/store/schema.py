"""The gallery store's on-disk layout and the rows it is made of.

A store is a directory::

    store.sqlite              items, their ordering scores, spaces, backfills, chunk_log,
                              serving_steps, erasures, orphan_slots, intents, meta
    writer.lock, writer.json  the writer lease (``lock``): one backfill, abort or serving step
    commit.lock, commit.json  the commit lock (``lock``): one write step at a time
    vectors/<storage>.f32     float32 rows, shape (capacity, dim); item ``slot`` s lives in row s
    vectors/<storage>.sum     one uint64 checksum per row (``vectors.vector_checksums``)
    vectors/<storage>.src     one uint64 hash of the source content each row was made from
    vectors/<storage>.journal the rows written since the last checkpoint (``vectors.VectorJournal``)

A space's ``storage`` names where its vectors live in the backend: its file name stem in the
embedded backend (the space's own name), a collection suffix in Milvus (``s<n>``, drawn once per
space: a space created again after an abort gets a new collection, and no space name makes a
collection name Milvus refuses). Every item has one slot, the same in every space, never reused
(``meta.next_slot``), and one ``space`` column naming the space that holds its authoritative vector.
An item updated with new content moves to a new slot (copy on write) and an erased one leaves its
slot behind; such a slot is an *orphan* (``orphan_slots``) until its vectors are destroyed in every
space. Ordering scores are kept per kind (``item_scores``), and the store records what each kind
means (``score_kinds``), so a backfill policy only ever reads the score it orders by.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from modelupgrade.errors import UserError

SCHEMA_VERSION = 6
DATABASE_FILE = "store.sqlite"
VECTORS_DIR = "vectors"

# Item backfill states: 'idle' (not part of a running backfill), 'pending' (queued in a planned
# chunk), 'done' (its vector in the target space is committed), 'failed' (skipped with a reason,
# still served from its previous space). A committed chunk's items read 'done' through the
# ``current_items`` view before their rows say so (see CURRENT_ITEMS_DDL).
ITEM_STATES = ("idle", "pending", "done", "failed")

DDL = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE spaces (
    name TEXT PRIMARY KEY,
    dim INTEGER NOT NULL CHECK (dim > 0),
    upgrades_from TEXT NOT NULL,
    backward_compatible INTEGER NOT NULL,
    model_ref TEXT NOT NULL,
    form TEXT NOT NULL CHECK (form IN ('new', 'rho')),
    created_at REAL NOT NULL,
    storage TEXT NOT NULL
);
CREATE UNIQUE INDEX spaces_storage ON spaces (storage);
CREATE TABLE items (
    slot INTEGER PRIMARY KEY,
    item_id TEXT NOT NULL UNIQUE,
    source_path TEXT NOT NULL,
    source_index INTEGER NOT NULL,
    label INTEGER,
    space TEXT NOT NULL REFERENCES spaces(name),
    state TEXT NOT NULL DEFAULT 'idle' CHECK (state IN ('idle', 'pending', 'done', 'failed')),
    backfill_id INTEGER,
    planned_chunk INTEGER,
    backfill_rank INTEGER,
    committed_chunk INTEGER,
    failure TEXT
);
CREATE INDEX items_queue ON items (state, planned_chunk, backfill_rank);
CREATE TABLE score_kinds (
    kind TEXT PRIMARY KEY,
    meaning TEXT NOT NULL,
    recorded_at REAL NOT NULL
);
CREATE TABLE item_scores (
    kind TEXT NOT NULL REFERENCES score_kinds(kind),
    slot INTEGER NOT NULL REFERENCES items(slot),
    value REAL NOT NULL,
    PRIMARY KEY (kind, slot)
);
CREATE TABLE backfills (
    id INTEGER PRIMARY KEY,
    source_space TEXT NOT NULL REFERENCES spaces(name),
    target_space TEXT NOT NULL REFERENCES spaces(name),
    method TEXT NOT NULL,
    policy TEXT NOT NULL,
    seed INTEGER NOT NULL,
    chunk_size INTEGER NOT NULL,
    total INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('running', 'complete')),
    started_at REAL NOT NULL,
    finished_at REAL,
    unit INTEGER NOT NULL
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

# The cutover, rollback and cleanup steps of completed backfills (``modelupgrade.store.cutover``):
# who took each (user@host), when, why, and what it was shown (JSON: the shadow evaluation, the
# space dropped). Steps act on a *serving unit* (``backfills.unit``, the id of its first backfill):
# a backfill into the same space from the same source as the last one, complete and neither rolled
# back nor cleaned up (the items ingested after it finished), continues its unit, and a step moves
# every item of the unit. The last step taken on a unit is the serving state of its backfills.
SERVING_STEPS_DDL = """
CREATE TABLE IF NOT EXISTS serving_steps (
    id INTEGER PRIMARY KEY,
    backfill_id INTEGER NOT NULL REFERENCES backfills(id),
    step TEXT NOT NULL CHECK (step IN ('cutover', 'rollback', 'cleanup')),
    from_space TEXT NOT NULL,
    to_space TEXT NOT NULL,
    actor TEXT NOT NULL,
    at REAL NOT NULL,
    reason TEXT NOT NULL,
    detail TEXT NOT NULL
);
"""
DDL += SERVING_STEPS_DDL

# What every item is now, as the backfill ledger records it. A chunk commit writes one chunk_log
# row, not one row per item (a chunk's items are scattered over the item table, so rewriting their
# rows rewrote hundreds of pages per commit: most of what crash safety cost at 100,000 items). An
# item still 'pending' in its row whose planned chunk is in the chunk log is done, in the backfill's
# target space; failures are the exception and are written to their rows. ``BackfillLedger.finish``
# writes the derived state into the rows once a backfill is complete, so at rest the rows are true;
# while a backfill runs, every reader of an item's space or state reads this view.
CURRENT_ITEMS_DDL = """
CREATE VIEW IF NOT EXISTS current_items AS
SELECT i.slot, i.item_id, i.source_path, i.source_index, i.label,
    CASE WHEN c.chunk IS NULL THEN i.space ELSE b.target_space END AS space,
    CASE WHEN c.chunk IS NULL THEN i.state ELSE 'done' END AS state,
    i.backfill_id, i.planned_chunk, i.backfill_rank,
    COALESCE(i.committed_chunk, c.chunk) AS committed_chunk, i.failure
FROM items AS i
LEFT JOIN chunk_log AS c
    ON i.state = 'pending' AND c.backfill_id = i.backfill_id AND c.chunk = i.planned_chunk
LEFT JOIN backfills AS b ON b.id = c.backfill_id;
"""
DDL += CURRENT_ITEMS_DDL

# Live writes (``modelupgrade.store.live``): each erasure recorded (when, who, why, how many; never
# which items), the slots whose vectors are still to be destroyed in every space (an erased item's,
# an updated item's old one), and the write-ahead intents of steps that change the vector backend
# and the database together (a Milvus alias move and its record): the next writer completes them.
LIVE_DDL = """
CREATE TABLE IF NOT EXISTS erasures (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    actor TEXT NOT NULL,
    reason TEXT NOT NULL,
    items INTEGER NOT NULL,
    destroyed_at REAL
);
CREATE TABLE IF NOT EXISTS orphan_slots (
    slot INTEGER PRIMARY KEY,
    cause TEXT NOT NULL CHECK (cause IN ('erase', 'update')),
    erasure_id INTEGER REFERENCES erasures(id),
    since REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS intents (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    at REAL NOT NULL
);
"""
DDL += LIVE_DDL

# Counters in ``meta`` (never reused): the next item slot, backfill id and Milvus storage number.
COUNTERS = ("next_slot", "next_backfill", "next_storage")


# Schema version → the statements that bring a store of that version to the next one. A migration
# only adds what the older version lacks, so an older store keeps every row it had (a version-3
# store's rows were all written per item, which the view reads as they are).
def schema_4_to_5(db: sqlite3.Connection) -> None:
    """Version 4 → 5: each space's vectors keep the name they had (``storage``: its own name, an
    embedded store's file stem), the counters start past what the store holds, and the live-write
    tables appear."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(spaces)")}
    if "storage" not in columns:
        db.execute("ALTER TABLE spaces ADD COLUMN storage TEXT")
        db.execute("UPDATE spaces SET storage = name")
    db.execute("CREATE UNIQUE INDEX IF NOT EXISTS spaces_storage ON spaces (storage)")
    db.execute(
        "INSERT OR IGNORE INTO meta (key, value) "
        "SELECT 'next_slot', COALESCE(MAX(slot), -1) + 1 FROM items"
    )
    db.execute(
        "INSERT OR IGNORE INTO meta (key, value) "
        "SELECT 'next_backfill', COALESCE(MAX(id), 0) + 1 FROM backfills"
    )
    for key, value in (("next_storage", "1"), ("items_epoch", "0")):
        db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", (key, value))
    for statement in LIVE_DDL.split(";"):
        if statement.strip():
            db.execute(statement)


def schema_5_to_6(db: sqlite3.Connection) -> None:
    """Version 5 → 6: each backfill gets its serving unit; an older store's backfills were each
    stepped alone, so each is a unit of its own."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(backfills)")}
    if "unit" not in columns:
        db.execute("ALTER TABLE backfills ADD COLUMN unit INTEGER")
        db.execute("UPDATE backfills SET unit = id")


MIGRATIONS: dict[int, str | Callable[[sqlite3.Connection], None]] = {
    2: SERVING_STEPS_DDL,
    3: CURRENT_ITEMS_DDL,
    4: schema_4_to_5,
    5: schema_5_to_6,
}


@dataclass(frozen=True)
class ItemRow:
    """One gallery item as the backfill sees it."""

    slot: int
    item_id: str
    source_path: str
    source_index: int
    label: int | None
    space: str


ITEM_COLUMNS = "slot, item_id, source_path, source_index, label, space"


@dataclass(frozen=True)
class ItemFailure:
    """An item a backfill could not move (or an ingest skipped), and why."""

    item_id: str
    reason: str


@dataclass(frozen=True)
class Backfill:
    id: int
    source_space: str
    target_space: str
    method: str
    policy: str
    seed: int
    chunk_size: int
    total: int
    status: str
    started_at: float
    finished_at: float | None
    unit: int  # the first backfill of its serving unit (``SERVING_STEPS_DDL``)


@dataclass(frozen=True)
class Chunk:
    backfill_id: int
    index: int
    items: tuple[ItemRow, ...]

    @property
    def slots(self) -> np.ndarray:
        return np.fromiter(
            (item.slot for item in self.items), dtype=np.int64, count=len(self.items)
        )


@dataclass(frozen=True)
class ChunkCommit:
    """A computed chunk ready to commit: the slots written (rows already
    durable) and the failures."""

    chunk: Chunk
    written: np.ndarray
    failures: dict[int, str]
    vectors_sha256: str


@dataclass(frozen=True)
class Snapshot:
    """A consistent view of which space serves each item, taken in one read transaction
    (``modelupgrade.store.snapshots``): per item (slot order) its id and current space (a name,
    and a code into ``names``), and per space the filter a vector database picks its part by."""

    slots: np.ndarray
    item_ids: np.ndarray
    spaces: np.ndarray
    serving_space: str | None
    active_backfill: Backfill | None
    commit_counter: int
    codes: np.ndarray | None = None
    names: tuple[str, ...] = ()
    filters: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.slots)

    def partitions(self) -> dict[str, np.ndarray]:
        """Positions (into ``slots``) of the items held by each space."""
        if self.codes is None:
            return {
                str(space): np.flatnonzero(self.spaces == space) for space in np.unique(self.spaces)
            }
        found = {}
        for code in np.unique(self.codes):
            found[self.names[int(code)]] = np.flatnonzero(self.codes == code)
        return found


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
