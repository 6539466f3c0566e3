"""What a store holds and how far its backfill is: the status that commands and the service show,
as typed records (``StoreStatus``, ``BackfillState``, ``CutoverState``); ``as_dict`` is the JSON
edge."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from modelupgrade.store.database import Database
from modelupgrade.store.ledger import BackfillLedger
from modelupgrade.store.schema import SCHEMA_VERSION, Backfill, ItemFailure
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
class BackfillState:
    """The store's last backfill: its plan and how far it is, across every run that worked on it."""

    id: int
    source_space: str
    target_space: str
    method: str
    policy: str
    seed: int
    chunk_size: int
    status: str
    total: int
    done: int
    failed: int
    pending: int
    fraction_done: float
    chunks_committed: int
    started_at: float
    finished_at: float | None


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
    index: dict[str, Any] = field(default_factory=dict)
    # The last backfill's cutover, rollback and cleanup steps (``modelupgrade.store.cutover``),
    # oldest first, each with who took it, when and why; and where that leaves it.
    serving_steps: list[ServingStep] = field(default_factory=list)
    cutover: CutoverState | None = None
    # Erasures recorded (when, who, why, how many: never which items).
    erasures: int = 0
    # What a write-ahead intent left for the next writer (an interrupted cutover or rollback).
    pending_intents: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        found = asdict(self)
        found["serving_steps"] = [step.as_dict() for step in self.serving_steps]
        return found

    def describe(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


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
        steps = [] if backfill is None else steps_in(db, backfill.id)
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
        id=backfill.id,
        source_space=backfill.source_space,
        target_space=backfill.target_space,
        method=backfill.method,
        policy=backfill.policy,
        seed=backfill.seed,
        chunk_size=backfill.chunk_size,
        status=backfill.status,
        total=total,
        done=done,
        failed=failed,
        pending=total - done - failed,
        fraction_done=float(done / total) if total else 1.0,
        chunks_committed=int(chunks),
        started_at=backfill.started_at,
        finished_at=backfill.finished_at,
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
