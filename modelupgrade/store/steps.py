"""The recorded cutover, rollback and cleanup steps of a store's backfills (table
``serving_steps``): who took each, when, why and what it was shown. The steps themselves are
``modelupgrade.store.cutover``; the status reads them from here.
"""

from __future__ import annotations

import getpass
import json
import socket
import sqlite3
import time
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ServingStep:
    id: int
    backfill_id: int
    step: str
    from_space: str
    to_space: str
    actor: str
    at: float
    reason: str
    detail: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "at_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.at)),
        }

    def describe(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


def steps_in(db: sqlite3.Connection, backfill_id: int | None = None) -> list[ServingStep]:
    """The recorded steps (of one backfill, or all), oldest first."""
    query = "SELECT * FROM serving_steps"
    rows = (
        db.execute(query + " ORDER BY id").fetchall()
        if backfill_id is None
        else db.execute(query + " WHERE backfill_id = ? ORDER BY id", (backfill_id,)).fetchall()
    )
    return [_step(*row[:9]) for row in rows]


def _step(
    id: int,
    backfill_id: int,
    step: str,
    from_space: str,
    to_space: str,
    actor: str,
    at: float,
    reason: str,
    detail: str,
) -> ServingStep:
    """The record of one row of ``serving_steps`` (its columns in the table's order)."""
    return ServingStep(
        id, backfill_id, step, from_space, to_space, actor, at, reason, json.loads(detail)
    )


def window_ends(cut: ServingStep) -> float:
    """When the rollback window that cutover step ``cut`` opened closes (epoch seconds); the
    window's length is recorded with the step, so a later change of params moves no deadline."""
    return cut.at + float(cut.detail["rollback_window_hours"]) * 3600.0


def actor() -> str:
    """Who takes a step: the OS user at this host (what a person can trace)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
