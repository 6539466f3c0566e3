"""Cutover, rollback and cleanup of a completed backfill, each recorded (who, when, why).

A backfill switches the serving space when it is planned (queries use the new space for the items
already moved), and both spaces' vectors stay in the store: a backfill writes the target space's
beside the source's and never touches those. After it completes, its *last step* in
``serving_steps`` says where it stands:

* none: complete, serving the new space, not yet final;
* ``cutover``: the shadow evaluation passed (``modelupgrade.store.shadow``) and the new space is
  final; the backend's own readers are pointed at it (a Milvus alias); the old vectors are kept
  for the rollback window (``store.rollback_window_hours``), counted from this cutover;
* ``rollback``: every item the backfill moved points at its old vector again and the old space
  serves; a cutover (evaluated again) moves them back, their new vectors being still there;
* ``cleanup``: the old space's vectors are dropped; no rollback is possible any more.

The steps act on the store's last backfill's *serving unit* (``schema.SERVING_STEPS_DDL``): with
it, every earlier backfill it continues (the first moved the gallery, a later one the items
ingested after it), so a rollback returns every item the unit moved, and the unit's last step is
its state. Each holds the store's writer lease and, for its writes, its commit lock. A step that
points the backend's own readers (a Milvus alias) and records that in the database does so as one
recoverable step: a write-ahead *intent* (table ``intents``) is committed first, naming everything
the step will do; then the backend is pointed (idempotent); then one transaction moves the items,
the serving space, appends the step and deletes the intent. A writer killed anywhere in between
leaves the intent, and the next writer completes it before it writes anything
(``complete_intents``, run by ``recovery``): the alias and the database never disagree for longer
than it takes the next writer to start. Cleanup records its step with its intent before it drops
the vectors, so a crash never leaves a rollback that would find them gone; the next writer finishes
the drop.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.store.faults import boundary
from modelupgrade.store.intent_records import DiscardIntent, ServingIntent, record_intent
from modelupgrade.store.intents import complete_intents, complete_serving_step
from modelupgrade.store.ledger import BackfillLedger
from modelupgrade.store.schema import Backfill
from modelupgrade.store.steps import (
    UNIT_MEMBERS,
    ServingStep,
    StepDetail,
    actor,
    steps_in,
    window_ends,
)

if TYPE_CHECKING:
    from modelupgrade.store.gallery import GalleryStore
    from modelupgrade.store.shadow import ShadowEvaluation


def _reason(text: str, step: str) -> str:
    if not text.strip():
        raise UserError(
            f"a {step} needs a reason: it is recorded with who took it and when",
            hint='pass --reason "…" (e.g. the ticket or the evaluation that justifies it)',
        )
    return text.strip()


def _completed(store: GalleryStore, doing: str) -> tuple[Backfill, list[ServingStep]]:
    """The store's last backfill, complete, and the steps taken on its serving unit so far."""
    with store.db.read() as db:
        backfill = BackfillLedger.last_in(db)
        steps = [] if backfill is None else steps_in(db, backfill.unit)
    where = f" --store {store.path}"
    if backfill is None:
        raise UserError(
            f"cannot {doing}: the store at {store.path} has never been backfilled",
            hint=f"backfill it into the new space first (`modelupgrade backfill{where}`)",
        )
    if backfill.status != "complete":
        raise UserError(
            f"cannot {doing}: backfill {backfill.id} into {backfill.target_space!r} is not "
            "complete",
            hint=f"finish it (`modelupgrade backfill{where}` again, --retry-failed for failed "
            f"items) or undo it with `modelupgrade backfill{where} --abort`",
        )
    return backfill, steps


def _record(
    db: sqlite3.Connection,
    backfill: Backfill,
    step: str,
    from_space: str,
    to_space: str,
    reason: str,
    detail: StepDetail,
) -> ServingStep:
    db.execute(
        "INSERT INTO serving_steps (backfill_id, step, from_space, to_space, actor, at, reason, "
        "detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            backfill.id,
            step,
            from_space,
            to_space,
            actor(),
            time.time(),
            reason,
            json.dumps(detail.as_dict()),
        ),
    )
    return steps_in(db, backfill.unit)[-1]


def _serve(
    store: GalleryStore,
    backfill: Backfill,
    step: str,
    space: str,
    reason: str,
    detail: StepDetail,
) -> ServingStep:
    """Serve ``space``, one of ``backfill``'s two, as one recoverable step (see the module),
    recorded as ``step`` with ``detail`` (and the items moved and what the backend did)."""
    other = backfill.source_space if space == backfill.target_space else backfill.target_space
    intent = ServingIntent(
        step=step,
        backfill_id=backfill.id,
        from_space=other,
        to_space=space,
        reason=reason,
        actor=actor(),
        at=time.time(),
        detail=detail,
    )
    with store.committing(step):
        with store.db.write() as db:
            intent_id = record_intent(db, step, intent)
        boundary(f"{step}:intent")
        return complete_serving_step(store.db, store.vectors, store.spaces(), intent_id, intent)


def cutover(
    store: GalleryStore,
    reason: str,
    rollback_window_hours: float,
    evaluate: Callable[[Backfill], ShadowEvaluation],
) -> ServingStep:
    """Make the last backfill's new space final once ``evaluate`` (its shadow evaluation) passes."""
    reason = _reason(reason, "cutover")
    with store.writing("cut over"):
        backfill, steps = _completed(store, "cut over")
        last = steps[-1].step if steps else None
        if last == "cutover":
            raise UserError(
                f"backfill {backfill.id}: space {backfill.target_space!r} was already cut over "
                f"by {steps[-1].actor}",
                hint="`modelupgrade store-status` shows its steps; `modelupgrade rollback` "
                "returns to the old space",
            )
        if last == "cleanup":
            raise UserError(
                f"backfill {backfill.id}: space {backfill.target_space!r} is final and the "
                f"vectors of {backfill.source_space!r} were dropped",
                hint="nothing to cut over; a later model needs a new backfill",
            )
        with store.db.read() as db:
            strays = db.execute(
                # an item ingested after the unit's backfills has no backfill_id (NULL)
                "SELECT COUNT(*), MIN(item_id) FROM items WHERE space != ? AND (space != ? OR "
                f"backfill_id IS NULL OR backfill_id NOT IN ({UNIT_MEMBERS}))",
                (backfill.target_space, backfill.source_space, backfill.unit),
            ).fetchone()
        if strays[0]:
            raise UserError(
                f"cannot cut over: {strays[0]} item(s) have no vector in {backfill.target_space!r} "
                f"(ingested after backfill {backfill.id}), e.g. {strays[1]!r}",
                hint="backfill them into the new space first, then cut over",
            )
        evaluation = evaluate(backfill)
        if not evaluation.passed:
            raise UserError(
                f"cannot cut over to {backfill.target_space!r}: the shadow evaluation failed "
                f"({evaluation.summary()}); serving is unchanged",
                hint="`modelupgrade rollback` serves the old space again while the new model is "
                "fixed",
            )
        return _serve(
            store,
            backfill,
            "cutover",
            backfill.target_space,
            reason,
            StepDetail(
                shadow_evaluation=evaluation.as_dict(),
                rollback_window_hours=float(rollback_window_hours),
            ),
        )


def rollback(store: GalleryStore, reason: str) -> ServingStep:
    """Serve the last backfill's old space again: its items point at their old vectors."""
    reason = _reason(reason, "rollback")
    with store.writing("roll back"):
        backfill, steps = _completed(store, "roll back")
        last = steps[-1] if steps else None
        if last is not None and last.step == "cleanup":
            raise UserError(
                f"cannot roll back to {backfill.source_space!r}: its vectors were dropped by the "
                f"cleanup of {last.actor} at {last.as_dict()['at_utc']} ({last.reason})",
                hint=f"serving {backfill.source_space!r} again needs a backfill into it",
            )
        if last is not None and last.step == "rollback":
            raise UserError(
                f"backfill {backfill.id} was already rolled back to {backfill.source_space!r} by "
                f"{last.actor}",
                hint="`modelupgrade cutover` moves to the new space again",
            )
        _refuse_items_only_new(store, backfill)
        with store.db.read() as db:
            slots = [
                row[0]
                for row in db.execute(
                    f"SELECT slot FROM items WHERE space = ? AND backfill_id IN ({UNIT_MEMBERS})",
                    (backfill.target_space, backfill.unit),
                )
            ]
        # The old vectors are what queries will meet: they must be whole before anything moves.
        store.verify_vectors(backfill.source_space, np.asarray(slots, dtype=np.int64))
        return _serve(store, backfill, "rollback", backfill.source_space, reason, StepDetail())


def _refuse_items_only_new(store: GalleryStore, backfill: Backfill) -> None:
    """A rollback serves the old space, whose queries cannot meet the new model's vectors: every
    item in the new space must be one the unit moved (its old vector kept), none ingested there."""
    with store.db.read() as db:
        count, example = db.execute(
            "SELECT COUNT(*), MIN(item_id) FROM items WHERE space = ? AND (backfill_id IS NULL "
            f"OR backfill_id NOT IN ({UNIT_MEMBERS}))",
            (backfill.target_space, backfill.unit),
        ).fetchone()
    if count:
        raise UserError(
            f"cannot roll back to {backfill.source_space!r}: {count} item(s) were ingested into "
            f"{backfill.target_space!r} after backfill {backfill.id} and have no vector in "
            f"{backfill.source_space!r}, e.g. {example!r}",
            hint=f"erase them (`modelupgrade store-erase`) and ingest them into "
            f"{backfill.source_space!r} with the old model first, or keep serving "
            f"{backfill.target_space!r}",
        )


def cleanup(
    store: GalleryStore, reason: str, force: bool = False, now: float | None = None
) -> ServingStep:
    """Drop the old space's vectors of a cut-over backfill once its rollback window has passed
    (``force``: before)."""
    reason = _reason(reason, "cleanup")
    with store.writing("clean up"):
        backfill, steps = _completed(store, "clean up")
        last = steps[-1] if steps else None
        if last is not None and last.step == "cleanup":
            # A re-run after a crash between the record and the drop: the commit lock's recovery
            # finished the drop (``complete_intents``).
            with store.committing("clean up"):
                pass
            return last
        if last is None or last.step != "cutover":
            state = "was rolled back" if last is not None else "has not been cut over"
            raise UserError(
                f"cannot clean up: backfill {backfill.id} into {backfill.target_space!r} {state}, "
                f"so the vectors of {backfill.source_space!r} may still serve",
                hint="cleanup follows a cutover (`modelupgrade cutover`) and its rollback window",
            )
        ends = window_ends(last)
        current = time.time() if now is None else now
        if current < ends and not force:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ends))
            raise UserError(
                f"the rollback window of backfill {backfill.id} is open until {stamp} "
                f"({(ends - current) / 3600:.1f} h left); the vectors of "
                f"{backfill.source_space!r} are kept for a rollback until then",
                hint="run cleanup after it, or now with --force (the --reason says why)",
            )
        with store.db.read() as db:
            still = db.execute(
                "SELECT COUNT(*) FROM items WHERE space = ?", (backfill.source_space,)
            ).fetchone()[0]
        if still:
            raise UserError(
                f"cannot clean up: {still} item(s) are still served from {backfill.source_space!r}",
                hint="backfill them into the new space first",
            )
        storage = store.space(backfill.source_space).storage
        with store.committing("clean up"):
            with store.db.write() as db:
                step = _record(
                    db,
                    backfill,
                    "cleanup",
                    backfill.source_space,
                    backfill.target_space,
                    reason,
                    StepDetail(
                        dropped_space=backfill.source_space,
                        forced=bool(force and current < ends),
                        window_ended_at=ends,
                    ),
                )
                record_intent(db, "cleanup", DiscardIntent(storage))
            boundary("cleanup:recorded")
            complete_intents(store.db, store.vectors, store.spaces())
        return step
