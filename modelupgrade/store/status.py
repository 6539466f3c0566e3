"""What a store holds and how far its backfill is: the status that commands and the service show."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from modelupgrade.store.database import Database
from modelupgrade.store.ledger import BackfillLedger
from modelupgrade.store.schema import SCHEMA_VERSION, Backfill
from modelupgrade.store.spaces import SpaceSpec
from modelupgrade.store.steps import ServingStep, steps_in, window_ends


@dataclass
class StoreStatus:
    path: str
    schema_version: int
    items: int
    serving_space: str | None
    spaces: dict[str, dict[str, Any]]
    items_by_space: dict[str, int]
    items_by_state: dict[str, int]
    backfill: dict[str, Any] | None
    score_kinds: dict[str, str] = field(default_factory=dict)
    failed: list[dict[str, str]] = field(default_factory=list)
    # Where the vectors live (``modelupgrade.store.backends``): backend and address, no secret.
    vectors: dict[str, str] = field(default_factory=dict)
    # How each space is searched (store.index) and, from `store-status`, the index's recall@10
    # against an exact scan per space (``modelupgrade.store.search.index_recall``).
    index: dict[str, Any] = field(default_factory=dict)
    # The last backfill's cutover, rollback and cleanup steps (``modelupgrade.store.cutover``),
    # oldest first, each with who took it, when and why; and where that leaves it.
    serving_steps: list[dict[str, Any]] = field(default_factory=list)
    cutover: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

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
        backfill_info = None
        if backfill is not None:
            counts = dict(
                db.execute(
                    "SELECT state, COUNT(*) FROM current_items WHERE backfill_id = ? "
                    "GROUP BY state",
                    (backfill.id,),
                ).fetchall()
            )
            done, failed = int(counts.get("done", 0)), int(counts.get("failed", 0))
            chunks = db.execute(
                "SELECT COUNT(*) FROM chunk_log WHERE backfill_id = ?", (backfill.id,)
            ).fetchone()[0]
            backfill_info = {
                "id": backfill.id,
                "source_space": backfill.source_space,
                "target_space": backfill.target_space,
                "method": backfill.method,
                "policy": backfill.policy,
                "seed": backfill.seed,
                "chunk_size": backfill.chunk_size,
                "status": backfill.status,
                "total": backfill.total,
                "done": done,
                "failed": failed,
                "pending": int(backfill.total - done - failed),
                "fraction_done": float(done / backfill.total) if backfill.total else 1.0,
                "chunks_committed": int(chunks),
                "started_at": backfill.started_at,
                "finished_at": backfill.finished_at,
            }
        failed_rows = db.execute(
            "SELECT item_id, failure FROM items WHERE state = 'failed' ORDER BY backfill_rank"
        ).fetchall()
        steps = [] if backfill is None else steps_in(db, backfill.id)
    described = {
        name: {
            "dim": s.dim,
            "upgrades_from": list(s.upgrades_from),
            "backward_compatible": s.backward_compatible,
            "model_ref": s.model_ref,
            "form": s.form,
        }
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
        backfill=backfill_info,
        score_kinds=score_kinds,
        failed=[{"item_id": i, "reason": r} for i, r in failed_rows],
        serving_steps=[step.as_dict() for step in steps],
        cutover=None if backfill is None else _cutover_state(backfill, steps),
    )


def _cutover_state(backfill: Backfill, steps: list[ServingStep]) -> dict[str, Any] | None:
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
    return {
        "state": state,
        "new_space": backfill.target_space,
        "old_space": backfill.source_space,
        "old_vectors": "dropped" if last == "cleanup" else "kept",
        "rollback_window_ends_at": None if cut is None or last != "cutover" else window_ends(cut),
    }
