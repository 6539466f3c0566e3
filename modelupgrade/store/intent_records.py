"""The records of the store's write-ahead intents (``modelupgrade.store.intents``): what a step
will do, written inside the caller's transaction before the step changes the backend, and read
back by whoever completes it. A leaf of the store, so that the ledger records an abort's discarded
space through the same codec as a cleanup does."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from modelupgrade.json_data import JsonObject, json_record
from modelupgrade.store.steps import StepDetail


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
