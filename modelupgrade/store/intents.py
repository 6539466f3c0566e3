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
import time
from dataclasses import dataclass, replace
from typing import Any

from modelupgrade.json_data import JsonObject, json_record
from modelupgrade.store.backends.base import VectorBackend
from modelupgrade.store.database import Database
from modelupgrade.store.faults import boundary
from modelupgrade.store.ledger import BackfillLedger
from modelupgrade.store.spaces import SpaceSpec
from modelupgrade.store.steps import ServingStep, StepDetail, steps_in

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServingIntent:
    """A serving step (cutover, rollback) about to move the backend and the database: what the
    step will record once both are done."""

    step: str
    backfill_id: int
    from_space: str
    to_space: str
    reason: str
    actor: str
    at: float
    detail: StepDetail

    def as_dict(self) -> JsonObject:
        return {**json_record(self), "detail": self.detail.as_dict()}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ServingIntent:
        return cls(**{**raw, "detail": StepDetail.from_dict(raw["detail"])})


@dataclass(frozen=True)
class DiscardIntent:
    """A space's vectors about to be dropped (a cleanup, or an abort's discarded space)."""

    storage: str


def record_intent(db: sqlite3.Connection, kind: str, intent: ServingIntent | DiscardIntent) -> int:
    """Record an intent inside the caller's write transaction; returns its id."""
    detail = intent.as_dict() if isinstance(intent, ServingIntent) else json_record(intent)
    cursor = db.execute(
        "INSERT INTO intents (kind, detail, at) VALUES (?, ?, ?)",
        (kind, json.dumps(detail), time.time()),
    )
    return int(cursor.lastrowid or 0)


def point_items(db: sqlite3.Connection, backfill_id: int, from_space: str, to_space: str) -> int:
    """Point the items backfill ``backfill_id`` moved from ``from_space`` at their vector in
    ``to_space``."""
    return db.execute(
        "UPDATE items SET space = ? WHERE backfill_id = ? AND space = ?",
        (to_space, backfill_id, from_space),
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
        moved = point_items(db, backfill.id, intent.from_space, intent.to_space)
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
        step = steps_in(db, backfill.id)[-1]
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
