"""The recorded cutover, rollback and cleanup steps of a store's backfills (table
``serving_steps``): who took each, when, why and what it was shown. The steps themselves are
``modelupgrade.store.cutover``; the status reads them from here.
"""

from __future__ import annotations

import getpass
import json
import socket
import sqlite3
from dataclasses import dataclass, fields
from typing import Any

from modelupgrade.json_data import JsonObject, json_record, object_at, objects_at
from modelupgrade.store.shown import labelled, utc


@dataclass(frozen=True)
class StepDetail:
    """What a serving step recorded beside itself; each step fills the fields that concern it."""

    # cutover: the shadow evaluation it passed (``ShadowEvaluation.as_dict``), its window
    shadow_evaluation: JsonObject | None = None
    rollback_window_hours: float | None = None
    # cutover and rollback: the items moved, and what the backend now points where
    items_moved: int | None = None
    backend: str | None = None
    # cleanup: the space whose vectors it dropped, and whether before its window ended
    dropped_space: str | None = None
    forced: bool | None = None
    window_ended_at: float | None = None

    def as_dict(self) -> JsonObject:
        """The fields the step filled (the JSON recorded in ``serving_steps.detail``)."""
        return {name: value for name, value in json_record(self).items() if value is not None}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> StepDetail:
        known = {f.name for f in fields(cls)}
        return cls(**{name: value for name, value in raw.items() if name in known})


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
    detail: StepDetail

    def as_dict(self) -> JsonObject:
        return {**json_record(self), "detail": self.detail.as_dict(), "at_utc": utc(self.at)}

    def headline(self) -> str:
        """The step in one line: what, when, who and why."""
        return (
            f"{utc(self.at)}  {self.step} {self.from_space} → {self.to_space} by {self.actor}: "
            f"{self.reason}"
        )

    def describe(self) -> str:
        was = "" if self.step == "cleanup" else f" (was {self.from_space})"
        lines = [
            f"{self.step} of backfill {self.backfill_id}: serving {self.to_space}{was}",
            labelled("by", f"{self.actor} at {utc(self.at)}"),
            labelled("reason", self.reason),
        ]
        detail = self.detail
        if detail.items_moved is not None:
            lines.append(labelled("items moved", f"{detail.items_moved:,}"))
        if detail.shadow_evaluation is not None:
            lines.append(labelled("shadow evaluation", _shadow(detail.shadow_evaluation)))
        if detail.rollback_window_hours is not None:
            hours = detail.rollback_window_hours
            lines.append(
                labelled("rollback window", f"{hours:g} h, until {utc(window_ends(self))}")
            )
        if detail.dropped_space is not None:
            forced = " (--force: before its rollback window ended)" if detail.forced else ""
            lines.append(labelled("vectors dropped", f"{detail.dropped_space}{forced}"))
        return "\n".join(lines)


def _shadow(evaluation: JsonObject) -> str:
    """A recorded shadow evaluation (``ShadowEvaluation.as_dict``) in one line."""
    metric = str(evaluation.get("metric", ""))
    new, old = object_at(evaluation, "new_metrics"), object_at(evaluation, "old_metrics")
    scores = (
        f"; {metric} {new[metric]:.4f} new vs {old[metric]:.4f} old"
        if metric in new and metric in old
        else ""
    )
    checks = "; ".join(
        f"{c['name']}: {'pass' if c['passed'] else 'FAIL'} ({c['detail']})"
        for c in objects_at(evaluation, "checks")
    )
    verdict = "passed" if evaluation.get("passed") else "failed"
    return f"{verdict} on {evaluation.get('queries', 0)} queries{scores}" + (
        f"; {checks}" if checks else ""
    )


# The backfills of the serving unit ``?`` names (``schema.SERVING_STEPS_DDL``): a step moves their
# items.
UNIT_MEMBERS = "SELECT id FROM backfills WHERE unit = ?"

# The last step taken on the serving unit of the backfill aliased ``b`` (a correlated subquery;
# NULL before any): the serving state of ``b``.
UNIT_LAST_STEP = (
    "(SELECT s.step FROM serving_steps AS s JOIN backfills AS m ON m.id = s.backfill_id "
    "WHERE m.unit = b.unit ORDER BY s.id DESC LIMIT 1)"
)


def steps_in(db: sqlite3.Connection, unit: int | None = None) -> list[ServingStep]:
    """The recorded steps (of one serving unit, or all), oldest first."""
    query = "SELECT * FROM serving_steps"
    rows = (
        db.execute(query + " ORDER BY id").fetchall()
        if unit is None
        else db.execute(
            query + f" WHERE backfill_id IN ({UNIT_MEMBERS}) ORDER BY id", (unit,)
        ).fetchall()
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
        id,
        backfill_id,
        step,
        from_space,
        to_space,
        actor,
        at,
        reason,
        StepDetail.from_dict(json.loads(detail)),
    )


def window_ends(cut: ServingStep) -> float:
    """When the rollback window that cutover step ``cut`` opened closes (epoch seconds); the
    window's length is recorded with the step, so a later change of params moves no deadline."""
    hours = cut.detail.rollback_window_hours
    if hours is None:
        raise ValueError(f"serving step {cut.id} ({cut.step}) opened no rollback window")
    return cut.at + hours * 3600.0


def actor() -> str:
    """Who takes a step: the OS user at this host (what a person can trace)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
