"""The recorded cutover, rollback and cleanup steps of a store's backfills (table
``serving_steps``): who took each, when, why and what it was shown. The steps themselves are
``modelupgrade.store.cutover``; the status reads them from here.
"""

from __future__ import annotations

import getpass
import json
import socket
import sqlite3
from dataclasses import asdict, dataclass
from typing import Any

from modelupgrade.store.shown import labelled, utc


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
        return {**asdict(self), "at_utc": utc(self.at)}

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
        if "items_moved" in self.detail:
            lines.append(labelled("items moved", f"{self.detail['items_moved']:,}"))
        if "shadow_evaluation" in self.detail:
            lines.append(labelled("shadow evaluation", _shadow(self.detail["shadow_evaluation"])))
        if "rollback_window_hours" in self.detail:
            hours = float(self.detail["rollback_window_hours"])
            lines.append(
                labelled("rollback window", f"{hours:g} h, until {utc(window_ends(self))}")
            )
        if "dropped_space" in self.detail:
            forced = " (--force: before its rollback window ended)" if self.detail["forced"] else ""
            lines.append(labelled("vectors dropped", f"{self.detail['dropped_space']}{forced}"))
        return "\n".join(lines)


def _shadow(evaluation: dict[str, Any]) -> str:
    """A recorded shadow evaluation (``ShadowEvaluation.as_dict``) in one line."""
    metric = evaluation.get("metric", "")
    new, old = evaluation.get("new_metrics", {}), evaluation.get("old_metrics", {})
    scores = (
        f"; {metric} {new[metric]:.4f} new vs {old[metric]:.4f} old"
        if metric in new and metric in old
        else ""
    )
    checks = "; ".join(
        f"{c['name']}: {'pass' if c['passed'] else 'FAIL'} ({c['detail']})"
        for c in evaluation.get("checks", [])
    )
    verdict = "passed" if evaluation.get("passed") else "failed"
    return f"{verdict} on {evaluation.get('queries', 0)} queries{scores}" + (
        f"; {checks}" if checks else ""
    )


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
