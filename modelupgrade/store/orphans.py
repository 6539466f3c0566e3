"""Orphan slots: slots no item names any more (an erased item's, an updated item's old one) whose
vectors are still to be destroyed in every space. The writer that orphans them destroys them at
once; one that dies first leaves them to the next writer (``recovery``). Works on the database and
the backend alone, below ``GalleryStore``."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence

import numpy as np

from modelupgrade.store.backends.base import VectorBackend
from modelupgrade.store.database import Database
from modelupgrade.store.faults import boundary
from modelupgrade.store.spaces import SpaceSpec


def orphan(
    db: sqlite3.Connection, slots: Sequence[int], cause: str, erasure_id: int | None
) -> None:
    """Record ``slots`` as orphans inside the caller's write transaction; an erasure (``cause``
    ``erase``) also deletes their items and scores."""
    now = time.time()
    for start in range(0, len(slots), 900):
        part = [int(s) for s in slots[start : start + 900]]
        marks = ",".join("?" * len(part))
        if cause == "erase":
            db.execute(f"DELETE FROM item_scores WHERE slot IN ({marks})", part)
            db.execute(f"DELETE FROM items WHERE slot IN ({marks})", part)
        db.executemany(
            "INSERT OR IGNORE INTO orphan_slots (slot, cause, erasure_id, since) "
            "VALUES (?, ?, ?, ?)",
            ((slot, cause, erasure_id, now) for slot in part),
        )


def destroy_orphans(database: Database, vectors: VectorBackend, specs: list[SpaceSpec]) -> int:
    """Destroy the vectors of every orphan slot in every space of ``specs``, then forget the
    slots and mark their erasures done (the caller holds the commit lock); returns how many slots
    were destroyed."""
    slots = np.array([row[0] for row in database.query("SELECT slot FROM orphan_slots")], np.int64)
    if not len(slots):
        return 0
    vectors.destroy(specs, slots)
    boundary("erase:destroyed")
    with database.write() as db:
        db.execute("PRAGMA secure_delete = ON")
        erasures = [
            row[0]
            for row in db.execute(
                "SELECT DISTINCT erasure_id FROM orphan_slots WHERE erasure_id IS NOT NULL"
            )
        ]
        db.execute("DELETE FROM orphan_slots")
        db.executemany(
            "UPDATE erasures SET destroyed_at = ? WHERE id = ? AND destroyed_at IS NULL",
            ((time.time(), erasure) for erasure in erasures),
        )
    return len(slots)
