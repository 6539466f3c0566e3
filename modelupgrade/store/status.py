"""What a store holds and how far its backfill is: the status that commands and the service show,
as typed records (``StoreStatus``, ``BackfillState``, ``CutoverState``); ``as_dict`` is the JSON
edge."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modelupgrade.json_data import JsonObject, json_record
from modelupgrade.store.database import Database
from modelupgrade.store.ledger import BackfillLedger
from modelupgrade.store.schema import SCHEMA_VERSION, Backfill, ItemFailure
from modelupgrade.store.shown import after_failures, continued, item_lines, labelled, utc
from modelupgrade.store.spaces import SpaceSpec
from modelupgrade.store.steps import ServingStep, steps_in, window_ends


@dataclass(frozen=True)
class SpaceState:
    """One embedding space as a status shows it."""

    dim: int
    upgrades_from: tuple[str, ...]
    backward_compatible: bool
    model_ref: str
    form: str


@dataclass(frozen=True)
class BackfillState(Backfill):
    """The store's last backfill: its plan (``total``: the items still in it) and how far it is,
    across every run that worked on it."""

    done: int
    failed: int
    pending: int
    fraction_done: float
    chunks_committed: int


@dataclass(frozen=True)
class CutoverState:
    """Where the last (complete) backfill stands between completion and cleanup."""

    state: str
    new_space: str
    old_space: str
    old_vectors: str
    rollback_window_ends_at: float | None


@dataclass
class StoreStatus:
    path: str
    schema_version: int
    items: int
    serving_space: str | None
    spaces: dict[str, SpaceState]
    items_by_space: dict[str, int]
    items_by_state: dict[str, int]
    backfill: BackfillState | None
    score_kinds: dict[str, str] = field(default_factory=dict)
    failed: list[ItemFailure] = field(default_factory=list)
    # Where the vectors live (``modelupgrade.store.backends``): backend and address, no secret.
    vectors: dict[str, str] = field(default_factory=dict)
    # How each space is searched (store.index) and, from `store-status`, the index's recall@10
    # against an exact scan per space (``modelupgrade.store.search.index_recall``).
    index: JsonObject = field(default_factory=dict)
    # The cutover, rollback and cleanup steps of the last backfill's serving unit
    # (``modelupgrade.store.cutover``), oldest first, each with who took it, when and why; and
    # where that leaves it.
    serving_steps: list[ServingStep] = field(default_factory=list)
    cutover: CutoverState | None = None
    # Erasures recorded (when, who, why, how many: never which items).
    erasures: int = 0
    # What a write-ahead intent left for the next writer (an interrupted cutover or rollback).
    pending_intents: list[str] = field(default_factory=list)

    def as_dict(self) -> JsonObject:
        found = json_record(self)
        found["serving_steps"] = [step.as_dict() for step in self.serving_steps]
        return found

    def describe(self) -> str:
        serving = self.serving_space or "nothing yet"
        lines = [f"store {self.path}: {self.items:,} items, serving {serving}"]
        lines += self._where_lines()
        for name, space in self.spaces.items():
            lines.append(labelled(f"space {name}", _space(space, self.items_by_space.get(name, 0))))
        states = ", ".join(f"{state} {n:,}" for state, n in sorted(self.items_by_state.items()))
        lines.append(labelled("items by state", states or "none"))
        lines.append(labelled("scores", ", ".join(self.score_kinds) or "none"))
        lines += self._backfill_lines()
        lines += self._serving_lines()
        lines.append(labelled("erasures", f"{self.erasures:,} recorded"))
        if self.pending_intents:
            pending = ", ".join(self.pending_intents)
            lines.append(labelled("interrupted", f"{pending} (the next writer completes it)"))
        return "\n".join(lines)

    def _where_lines(self) -> list[str]:
        """Where the vectors live and how they are searched."""
        lines = []
        if self.vectors:
            shown = [f"{key} {value}" for key, value in self.vectors.items() if key != "backend"]
            lines.append(labelled("vectors", ", ".join([self.vectors.get("backend", "?"), *shown])))
        if self.index:
            recall = self.index.get("recall_at_10", {})
            measured = (
                ", ".join(f"{space} {value:.3f}" for space, value in recall.items())
                if isinstance(recall, dict)
                else ""
            )
            lines.append(
                labelled(
                    "index",
                    f"{self.index.get('kind', '?')}"
                    + (f"; recall@10 against an exact scan: {measured}" if measured else ""),
                )
            )
        return lines

    def _backfill_lines(self) -> list[str]:
        """The last backfill: where it is, and its failed items with what to run about them."""
        backfill = self.backfill
        if backfill is None:
            return [labelled("backfill", "none yet")]
        lines = [
            labelled(
                f"backfill {backfill.id}",
                f"{backfill.source_space} → {backfill.target_space}, {backfill.status}: "
                f"{backfill.done:,} of {backfill.total:,} done ({backfill.fraction_done:.1%}), "
                f"{backfill.failed:,} failed, {backfill.pending:,} pending",
            ),
            continued(
                f"{backfill.method}, {backfill.policy} order, {backfill.chunks_committed:,} "
                f"chunk(s) of {backfill.chunk_size:,} committed, started {utc(backfill.started_at)}"
                + (f", finished {utc(backfill.finished_at)}" if backfill.finished_at else "")
            ),
        ]
        if backfill.unit != backfill.id:
            lines.append(
                continued(
                    f"continues the serving unit of backfill {backfill.unit} (items ingested "
                    "since): a cutover or rollback moves every item of the unit"
                )
            )
        if self.failed:
            lines.append(
                labelled(
                    "failed items",
                    f"{len(self.failed):,}, still served from {backfill.source_space}:",
                )
            )
            lines += item_lines(self.failed)
            lines.append(labelled("next", after_failures(self.path)))
        return lines

    def _serving_lines(self) -> list[str]:
        """The steps of the last backfill's serving unit, and where they leave it."""
        lines = [labelled("serving steps", step.headline()) for step in self.serving_steps[:1]]
        lines += [continued(step.headline()) for step in self.serving_steps[1:]]
        cutover = self.cutover
        if cutover is not None:
            window = (
                f", rollback window open until {utc(cutover.rollback_window_ends_at)}"
                if cutover.rollback_window_ends_at is not None
                else ""
            )
            lines.append(
                labelled(
                    "cutover",
                    f"{cutover.state}; the vectors of {cutover.old_space} {cutover.old_vectors}"
                    f"{window}",
                )
            )
            if cutover.state in _NEXT_STEP:
                lines.append(labelled("next", _NEXT_STEP[cutover.state]))
        return lines


# What a person may run next from where a complete backfill stands (``CutoverState.state``).
_NEXT_STEP = {
    "awaiting cutover": '`modelupgrade cutover --reason "…" --query-split …` once the new space '
    "has been checked, or `modelupgrade rollback` to serve the old one",
    "cut over": "`modelupgrade rollback` to serve the old space again; `modelupgrade cleanup` "
    "drops its vectors once the rollback window has passed",
    "rolled back": "`modelupgrade cutover` to serve the new space again",
}


def _space(space: SpaceState, items: int) -> str:
    """A space in one line: its dimension, the items it serves and what it upgrades."""
    shown = [f"{space.dim}-d, {items:,} items"]
    if space.upgrades_from:
        compatible = (
            "backward compatible" if space.backward_compatible else "not backward compatible"
        )
        shown.append(f"upgrades {', '.join(space.upgrades_from)} ({compatible})")
    if space.form != "new":
        shown.append(f"form {space.form}")
    if space.model_ref:
        shown.append(f"model {space.model_ref}")
    return "; ".join(shown)


def read_status(database: Database, spaces: dict[str, SpaceSpec]) -> StoreStatus:
    """The store's status, read in one transaction."""
    with database.read() as db:
        items = int(db.execute("SELECT COUNT(*) FROM items").fetchone()[0])
        by_space = dict(
            db.execute("SELECT space, COUNT(*) FROM current_items GROUP BY space").fetchall()
        )
        by_state = dict(
            db.execute("SELECT state, COUNT(*) FROM current_items GROUP BY state").fetchall()
        )
        score_kinds = dict(
            db.execute("SELECT kind, meaning FROM score_kinds ORDER BY kind").fetchall()
        )
        serving = Database.meta(db, "serving_space")
        backfill = BackfillLedger.last_in(db)
        state = None if backfill is None else _backfill_state(db, backfill)
        failed_rows = db.execute(
            "SELECT item_id, failure FROM items WHERE state = 'failed' ORDER BY backfill_rank"
        ).fetchall()
        steps = [] if backfill is None else steps_in(db, backfill.unit)
        erasures = int(db.execute("SELECT COUNT(*) FROM erasures").fetchone()[0])
        intents = [row[0] for row in db.execute("SELECT kind FROM intents ORDER BY id")]
    described = {
        name: SpaceState(s.dim, s.upgrades_from, s.backward_compatible, s.model_ref, s.form)
        for name, s in spaces.items()
    }
    return StoreStatus(
        path=str(database.path),
        schema_version=SCHEMA_VERSION,
        items=items,
        serving_space=serving,
        spaces=described,
        items_by_space=by_space,
        items_by_state=by_state,
        backfill=state,
        score_kinds=score_kinds,
        failed=[ItemFailure(i, r) for i, r in failed_rows],
        serving_steps=steps,
        cutover=None if backfill is None else _cutover_state(backfill, steps),
        erasures=erasures,
        pending_intents=intents,
    )


def _backfill_state(db: Any, backfill: Backfill) -> BackfillState:
    counts = dict(
        db.execute(
            "SELECT state, COUNT(*) FROM current_items WHERE backfill_id = ? GROUP BY state",
            (backfill.id,),
        ).fetchall()
    )
    done, failed = int(counts.get("done", 0)), int(counts.get("failed", 0))
    chunks = db.execute(
        "SELECT COUNT(*) FROM chunk_log WHERE backfill_id = ?", (backfill.id,)
    ).fetchone()[0]
    # Items erased after they were planned leave the plan: the total counts what is still in it.
    total = done + failed + int(counts.get("pending", 0))
    return BackfillState(
        **vars(backfill) | {"total": total},
        done=done,
        failed=failed,
        pending=total - done - failed,
        fraction_done=float(done / total) if total else 1.0,
        chunks_committed=int(chunks),
    )


def _cutover_state(backfill: Backfill, steps: list[ServingStep]) -> CutoverState | None:
    """Where the last backfill stands between completion and cleanup (None while it runs)."""
    if backfill.status != "complete":
        return None
    last = steps[-1].step if steps else None
    state = {
        None: "awaiting cutover",
        "cutover": "cut over",
        "rollback": "rolled back",
        "cleanup": "cleaned up",
    }[last]
    cut = next((step for step in reversed(steps) if step.step == "cutover"), None)
    return CutoverState(
        state=state,
        new_space=backfill.target_space,
        old_space=backfill.source_space,
        old_vectors="dropped" if last == "cleanup" else "kept",
        rollback_window_ends_at=None if cut is None or last != "cutover" else window_ends(cut),
    )
