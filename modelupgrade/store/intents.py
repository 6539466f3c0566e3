"""Write-ahead intents: a step that changes the vector backend and the database together (a
serving step that moves a Milvus alias, a cleanup that drops a space's vectors) records what it
will do first (table ``intents``), then does it; whoever takes the commit lock next completes an
intent a dead writer left (``complete_intents``), so the backend and the database never disagree
for longer than it takes the next writer to start. Works on the database and the backend alone,
below ``GalleryStore``."""

from __future__ import annotations

import json
import logging
import sqlite3
from dataclasses import replace

from modelupgrade.store.backends.base import VectorBackend
from modelupgrade.store.database import Database
from modelupgrade.store.faults import boundary
from modelupgrade.store.intent_records import DiscardIntent, ServingIntent
from modelupgrade.store.ledger import BackfillLedger
from modelupgrade.store.spaces import SpaceSpec
from modelupgrade.store.steps import UNIT_MEMBERS, ServingStep, steps_in

log = logging.getLogger(__name__)


def point_items(db: sqlite3.Connection, unit: int, from_space: str, to_space: str) -> int:
    """Point the items the backfills of serving unit ``unit`` moved from ``from_space`` at their
    vector in ``to_space``."""
    return db.execute(
        f"UPDATE items SET space = ? WHERE space = ? AND backfill_id IN ({UNIT_MEMBERS})",
        (to_space, from_space, unit),
    ).rowcount


def complete_serving_step(
    database: Database,
    vectors: VectorBackend,
    spaces: dict[str, SpaceSpec],
    intent_id: int,
    intent: ServingIntent,
) -> ServingStep:
    """Carry out the serving step ``intent`` (recorded as intent ``intent_id``): point the
    backend (idempotent), then move the items, the serving space, record the step and drop the
    intent in one transaction. The caller holds the commit lock."""
    with database.read() as db:
        backfill = BackfillLedger.last_in(db)
    if backfill is None or backfill.id != intent.backfill_id:
        raise RuntimeError(f"intent {intent_id} names backfill {intent.backfill_id}")
    pointed = vectors.serve(spaces[intent.to_space])
    boundary(f"{intent.step}:backend")
    with database.write(items_changed=True) as db:
        moved = point_items(db, backfill.unit, intent.from_space, intent.to_space)
        Database.set_meta(db, "serving_space", intent.to_space)
        detail = replace(intent.detail, items_moved=moved, backend=pointed)
        db.execute(
            "INSERT INTO serving_steps (backfill_id, step, from_space, to_space, actor, at, "
            "reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                backfill.id,
                intent.step,
                intent.from_space,
                intent.to_space,
                intent.actor,
                intent.at,
                intent.reason,
                json.dumps(detail.as_dict()),
            ),
        )
        db.execute("DELETE FROM intents WHERE id = ?", (intent_id,))
        step = steps_in(db, backfill.unit)[-1]
    boundary(f"{intent.step}:committed")
    return step


def complete_intents(
    database: Database, vectors: VectorBackend, spaces: dict[str, SpaceSpec]
) -> int:
    """Complete every intent a writer that died left (the caller holds the commit lock); returns
    how many were completed."""
    intents = database.query("SELECT id, kind, detail FROM intents ORDER BY id")
    for intent_id, kind, detail in intents:
        recorded = json.loads(detail)
        if kind in ("cleanup", "discard"):  # a cleaned up or aborted space's vectors
            vectors.discard(DiscardIntent(**recorded).storage)
            boundary(f"{kind}:dropped")
            with database.write() as db:
                db.execute("DELETE FROM intents WHERE id = ?", (intent_id,))
        else:
            complete_serving_step(
                database, vectors, spaces, int(intent_id), ServingIntent.from_dict(recorded)
            )
        log.info("completed the %s recorded as intent %d", kind, intent_id)
    return len(intents)
