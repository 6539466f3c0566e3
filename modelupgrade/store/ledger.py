"""The backfill state machine of a store: the plan, its chunks, their commits, and the chunk log.

A backfill is *planned* once: every item not yet in the target space is queued in the policy's
order and cut into fixed chunks, in one transaction, so chunk membership never changes afterwards
and a resumed job redoes exactly the chunk it was working on. A chunk is *committed* in one
transaction that appends it to the chunk log, whose key forbids a second commit of the same chunk,
and records its failures; its written items are in the target space from then on, as the
``current_items`` view reads them (progress is recorded per chunk, not per item row).

A backfill is *complete* only when every item it planned is in the target space; one with failed
items stays running until they are retried (``retry_failed``) or the backfill is *aborted*, which
returns every item to the space it had and the store to the serving space it had when the plan was
written, as if the backfill had never run.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar, cast

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject, json_record
from modelupgrade.store.database import Database
from modelupgrade.store.intent_records import DiscardIntent, record_intent
from modelupgrade.store.schema import (
    ITEM_COLUMNS,
    Backfill,
    Chunk,
    ChunkCommit,
    ItemFailure,
    ItemRow,
)
from modelupgrade.store.shown import labelled, utc
from modelupgrade.store.spaces import SpaceSpec
from modelupgrade.store.steps import UNIT_LAST_STEP

# meta keys: the serving space a running backfill replaced, and the record of the last abort
_SERVING_BEFORE = "serving_space_before_backfill"
_LAST_ABORTED = "last_aborted_backfill"


@dataclass(frozen=True)
class AbortRecord:
    """What an abort undid (also recorded in the store's meta as its last abort)."""

    backfill_id: int
    source_space: str
    target_space: str
    items: int
    items_moved_back: int
    serving_space: str
    target_space_dropped: bool
    target_storage: str | None
    started_at: float
    aborted_at: float

    def as_dict(self) -> JsonObject:
        return json_record(self)

    def describe(self) -> str:
        target = (
            "dropped, its vectors discarded"
            if self.target_space_dropped
            else "kept (other records still name it)"
        )
        moved = f"{self.source_space} → {self.target_space}"
        moved_back = f"{self.items_moved_back:,} of the {self.items:,} planned"
        return "\n".join(
            [
                f"backfill {self.backfill_id} ({moved}) aborted: serving {self.serving_space}",
                labelled("items moved back", f"{moved_back}, into {self.source_space}"),
                labelled(f"space {self.target_space}", target),
                labelled("started", utc(self.started_at)),
                labelled("aborted", utc(self.aborted_at)),
            ]
        )


class ChunkLogRow(TypedDict):
    """A committed chunk, as the chunk log records it."""

    backfill_id: int
    chunk: int
    items: int
    written: int
    failed: int
    vectors_sha256: str
    committed_at: float


class ItemStateRow(TypedDict):
    """An item's id, space and backfill state (``current_items``)."""

    slot: int
    item_id: str
    space: str
    state: str
    backfill_id: int | None
    committed_chunk: int | None
    failure: str | None


Row = TypeVar("Row", ChunkLogRow, ItemStateRow)


def _columns(record: type) -> str:
    """The columns a row record names, in its order (each field is the column of its name)."""
    return ", ".join(record.__annotations__)


def _records(record: type[Row], rows: Sequence[Sequence[Any]]) -> list[Row]:
    """Rows selected by ``_columns(record)``, as that record."""
    return [cast(Row, dict(zip(record.__annotations__, row, strict=True))) for row in rows]


class BackfillLedger:
    def __init__(self, database: Database) -> None:
        self.db = database

    # ----- which backfill -----------------------------------------------------------------------
    @staticmethod
    def active_in(db: sqlite3.Connection) -> Backfill | None:
        row = db.execute(
            "SELECT * FROM backfills WHERE status = 'running' ORDER BY id DESC LIMIT 1"
        ).fetchone()
        return None if row is None else Backfill(*row)

    @classmethod
    def running_in(cls, db: sqlite3.Connection) -> Backfill:
        """The running backfill, inside the transaction that has just started (or restarted) it."""
        backfill = cls.active_in(db)
        if backfill is None:
            raise RuntimeError("no running backfill in the transaction that started one")
        return backfill

    @staticmethod
    def last_in(db: sqlite3.Connection) -> Backfill | None:
        row = db.execute("SELECT * FROM backfills ORDER BY id DESC LIMIT 1").fetchone()
        return None if row is None else Backfill(*row)

    def active(self) -> Backfill | None:
        with self.db.lock:
            return self.active_in(self.db.connection)

    def last(self) -> Backfill | None:
        with self.db.lock:
            return self.last_in(self.db.connection)

    # ----- planning -----------------------------------------------------------------------------
    def check_plan(self, target: SpaceSpec) -> tuple[str, np.ndarray]:
        """(source space, slots to move) of a backfill into ``target`` planned now, or the
        ``UserError`` that ``plan`` would raise; changes nothing."""
        with self.db.read() as db:
            return self._plannable(db, target)

    def _plannable(self, db: sqlite3.Connection, target: SpaceSpec) -> tuple[str, np.ndarray]:
        active = self.active_in(db)
        if active is not None:
            raise UserError(
                f"a backfill into space {active.target_space!r} is already running in this store",
                hint="resume it (the same command again), or abandon it with "
                "`modelupgrade backfill --abort`",
            )
        failed = db.execute("SELECT COUNT(*) FROM items WHERE state = 'failed'").fetchone()[0]
        if failed:
            raise UserError(
                f"{failed} item(s) failed in the previous backfill and are "
                "still in their old space",
                hint="retry them first (`modelupgrade backfill --retry-failed`)",
            )
        rows = db.execute(
            "SELECT slot, space FROM current_items WHERE space != ? ORDER BY slot", (target.name,)
        ).fetchall()
        sources = sorted({space for _, space in rows})
        if not rows:
            raise UserError(
                f"every item of the store is already in space {target.name!r}; nothing to backfill"
            )
        if len(sources) > 1:
            raise UserError(
                f"the items to backfill are spread over several spaces ({', '.join(sources)})",
                hint="finish the earlier backfill before starting another",
            )
        source = sources[0]
        if not target.can_replace(source):
            raise UserError(
                f"model {target.name!r} is not compatible with the store: the store's vectors "
                f"are in space {source!r}, but {target.name!r} upgrades from "
                f"{', '.join(target.upgrades_from) or 'no earlier generation'}",
                hint=f"backfill with a model trained to upgrade {source!r}, or upgrade the "
                "store through the generations in between first",
            )
        return source, np.fromiter((slot for slot, _ in rows), dtype=np.int64, count=len(rows))

    def plan(
        self,
        target: SpaceSpec,
        method: str,
        policy: str,
        seed: int,
        order: np.ndarray,
        chunk_size: int,
    ) -> Backfill:
        """Queue every item not yet in ``target``, in ``order`` (slots), cut into fixed chunks, and
        make ``target`` the serving space."""
        if chunk_size < 1:
            raise UserError(f"chunk_size must be ≥ 1, got {chunk_size}")
        with self.db.write(items_changed=True) as db:
            source, to_move = self._plannable(db, target)
            order = np.asarray(order, dtype=np.int64)
            if len(order) != len(to_move) or set(order.tolist()) != set(to_move.tolist()):
                raise ValueError("the backfill order must list every item to backfill exactly once")
            # Ids are never reused (an aborted backfill's row goes, its id stays taken): a vector
            # database row records the backfill that wrote it (``backends.milvus``).
            backfill_id = Database.take_counter(db, "next_backfill")
            unit = self._continued_unit(db, source, target.name) or backfill_id
            db.execute(
                "INSERT INTO backfills (id, source_space, target_space, method, policy, seed, "
                "chunk_size, total, status, started_at, unit) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, ?)",
                (
                    backfill_id,
                    source,
                    target.name,
                    method,
                    policy,
                    int(seed),
                    chunk_size,
                    len(order),
                    time.time(),
                    unit,
                ),
            )
            db.executemany(
                # the row's space is what a chunk commit does not rewrite: the source's
                "UPDATE items SET space = ?, state = 'pending', backfill_id = ?, "
                "planned_chunk = ?, backfill_rank = ?, committed_chunk = NULL, failure = NULL "
                "WHERE slot = ?",
                (
                    (source, backfill_id, rank // chunk_size, rank, int(slot))
                    for rank, slot in enumerate(order)
                ),
            )
            db.execute("UPDATE items SET state = 'idle' WHERE space = ?", (target.name,))
            Database.set_meta(db, _SERVING_BEFORE, Database.meta(db, "serving_space") or source)
            Database.set_meta(db, "serving_space", target.name)
            return self.running_in(db)

    @staticmethod
    def _continued_unit(db: sqlite3.Connection, source: str, target: str) -> int | None:
        """The serving unit a backfill from ``source`` into ``target`` planned now continues: the
        last backfill's, when that one is complete, between the same two spaces, and its unit
        neither rolled back nor cleaned up (``schema.SERVING_STEPS_DDL``). Its items stay where
        they are; the new backfill moves those ingested since, and a step moves them all."""
        row = db.execute(
            "SELECT b.unit FROM backfills AS b WHERE b.id = (SELECT MAX(id) FROM backfills) AND "
            "b.status = 'complete' AND b.source_space = ? AND b.target_space = ? AND "
            f"COALESCE({UNIT_LAST_STEP}, '') NOT IN ('rollback', 'cleanup')",
            (source, target),
        ).fetchone()
        return None if row is None else int(row[0])

    @staticmethod
    def queue(db: sqlite3.Connection, backfill: Backfill, slots: np.ndarray) -> None:
        """Add the items of ``slots`` (in the backfill's source space, not in its plan) to the
        running ``backfill``: new chunks after its last one, in the order given, inside the
        caller's write transaction. The job reads them when it gets there; until their chunk
        commits they are served from the source space like every item not yet moved."""
        last_chunk, last_rank = db.execute(
            "SELECT COALESCE(MAX(planned_chunk), -1), COALESCE(MAX(backfill_rank), -1) FROM items "
            "WHERE backfill_id = ?",
            (backfill.id,),
        ).fetchone()
        first_chunk = int(last_chunk) + 1
        db.executemany(
            "UPDATE items SET state = 'pending', backfill_id = ?, planned_chunk = ?, "
            "backfill_rank = ?, committed_chunk = NULL, failure = NULL WHERE slot = ?",
            (
                (backfill.id, first_chunk + i // backfill.chunk_size, int(last_rank) + 1 + i, slot)
                for i, slot in enumerate(np.asarray(slots, dtype=np.int64).tolist())
            ),
        )
        db.execute("UPDATE backfills SET total = total + ? WHERE id = ?", (len(slots), backfill.id))

    def retry_failed(self) -> Backfill:
        """Re-queue the failed items of the last backfill as new chunks after its last one."""
        with self.db.write(items_changed=True) as db:
            backfill = self.last_in(db)
            if backfill is None:
                raise UserError("this store has never been backfilled; there is nothing to retry")
            failed = [
                r[0]
                for r in db.execute(
                    "SELECT slot FROM items WHERE state = 'failed' ORDER BY backfill_rank"
                )
            ]
            if not failed:
                raise UserError("no failed items to retry")
            next_chunk = int(
                db.execute(
                    "SELECT COALESCE(MAX(planned_chunk), -1) + 1 FROM items WHERE backfill_id = ?",
                    (backfill.id,),
                ).fetchone()[0]
            )
            db.executemany(
                "UPDATE items SET state = 'pending', planned_chunk = ?, committed_chunk = NULL, "
                "failure = NULL WHERE slot = ?",
                ((next_chunk + i // backfill.chunk_size, slot) for i, slot in enumerate(failed)),
            )
            db.execute(
                "UPDATE backfills SET status = 'running', finished_at = NULL WHERE id = ?",
                (backfill.id,),
            )
            return self.running_in(db)

    # ----- chunks -------------------------------------------------------------------------------
    def next_chunks(
        self, backfill: Backfill, after: int = -1, limit: int | None = 1
    ) -> list[Chunk]:
        """Up to ``limit`` (None: all) planned chunks after chunk ``after`` that still have pending
        items, in plan order, read in one transaction (a job reads ahead rather than wait on each
        commit; a pool of workers takes them all)."""
        with self.db.read() as db:
            # A committed chunk's rows still say 'pending' (``CURRENT_ITEMS_DDL``): the chunk log
            # tells them apart.
            indexes = [
                row[0]
                for row in db.execute(
                    "SELECT DISTINCT planned_chunk FROM items WHERE state = 'pending' AND "
                    "backfill_id = ? AND planned_chunk > ? AND NOT EXISTS (SELECT 1 FROM "
                    "chunk_log WHERE chunk_log.backfill_id = items.backfill_id AND "
                    "chunk_log.chunk = items.planned_chunk) ORDER BY planned_chunk LIMIT ?",
                    (backfill.id, after, -1 if limit is None else limit),
                )
            ]
            if not indexes:
                return []
            rows = db.execute(
                f"SELECT planned_chunk, {ITEM_COLUMNS} FROM items "
                "WHERE state = 'pending' AND backfill_id = ? AND planned_chunk BETWEEN ? AND ? "
                "ORDER BY planned_chunk, backfill_rank",
                (backfill.id, indexes[0], indexes[-1]),
            ).fetchall()
        wanted = set(indexes)
        rows = [row for row in rows if row[0] in wanted]
        by_chunk: dict[int, list[ItemRow]] = {index: [] for index in indexes}
        for planned_chunk, *item in rows:
            by_chunk[planned_chunk].append(ItemRow(*item))
        return [Chunk(backfill.id, index, tuple(items)) for index, items in by_chunk.items()]

    def commit_chunks(self, target_space: str, commits: Sequence[ChunkCommit]) -> None:
        """Commit several chunks in one transaction (a group commit): all of them or none.

        The caller has made the written rows durable first. One transaction, hence one WAL sync, for
        a run of chunks whose rows were made durable with one vector sync: what lets a backfill keep
        up when its ψ is cheaper than a sync. A chunk's commit writes its chunk log row and a row
        per failed item, never one per written item: its items read done through the
        ``current_items`` view (``CURRENT_ITEMS_DDL``), so a commit costs the same few pages
        however the chunk's items are spread over the item table.
        """
        for commit in commits:
            written = {int(s) for s in commit.written}
            expected = {item.slot for item in commit.chunk.items}
            if written | set(commit.failures) != expected or written & set(commit.failures):
                raise ValueError(
                    "a chunk commit must account for every item of the chunk exactly once"
                )
        if not commits:
            return
        failures = any(commit.failures for commit in commits)
        with self.db.write(items_changed=failures) as db:
            for commit in commits:
                chunk, slots = commit.chunk, sorted(item.slot for item in commit.chunk.items)
                logged = db.execute(
                    "SELECT COUNT(*) FROM chunk_log WHERE backfill_id = ? AND chunk = ?",
                    (chunk.backfill_id, chunk.index),
                ).fetchone()[0]
                still_pending = db.execute(
                    "SELECT COUNT(*) FROM items WHERE state = 'pending' AND backfill_id = ? AND "
                    f"planned_chunk = ? AND slot IN ({','.join('?' * len(slots))})",
                    [chunk.backfill_id, chunk.index, *slots],
                ).fetchone()[0]
                if logged or still_pending != len(slots):
                    raise RuntimeError(
                        f"chunk {chunk.index} of backfill {chunk.backfill_id} was already committed"
                    )
                db.execute(
                    "INSERT INTO chunk_log VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        chunk.backfill_id,
                        chunk.index,
                        len(slots),
                        len(commit.written),
                        len(commit.failures),
                        commit.vectors_sha256,
                        time.time(),
                    ),
                )
                db.executemany(
                    "UPDATE items SET state = 'failed', failure = ?, "
                    "committed_chunk = ? WHERE slot = ?",
                    ((reason, chunk.index, slot) for slot, reason in commit.failures.items()),
                )

    def finish(self, backfill: Backfill) -> tuple[int, int]:
        """(pending, failed) items of ``backfill``; it is marked complete when both are 0, that
        is when every item it planned is in the target space."""
        with self.db.write(items_changed=True) as db:
            counts = dict(
                db.execute(
                    "SELECT state, COUNT(*) FROM current_items WHERE backfill_id = ? "
                    "AND state IN ('pending', 'failed') GROUP BY state",
                    (backfill.id,),
                ).fetchall()
            )
            pending, failed = int(counts.get("pending", 0)), int(counts.get("failed", 0))
            if not pending and not failed:
                # Every chunk is committed: write what the chunk log says into the item rows, in one
                # pass over the table, so that at rest the rows are true (``CURRENT_ITEMS_DDL``).
                db.execute(
                    "UPDATE items SET space = ?, state = 'done', committed_chunk = planned_chunk "
                    "WHERE backfill_id = ? AND state = 'pending'",
                    (backfill.target_space, backfill.id),
                )
                db.execute(
                    "UPDATE backfills SET status = 'complete', finished_at = ? WHERE id = ? "
                    "AND status = 'running'",
                    (time.time(), backfill.id),
                )
                db.execute("DELETE FROM meta WHERE key = ?", (_SERVING_BEFORE,))
        return pending, failed

    def abort(self) -> AbortRecord:
        """Undo the running backfill in one transaction: every item it planned back in its source
        space (whose vectors a backfill never touches), the serving space the store had before it,
        its plan, chunk log and row gone, and its target space too unless something else still
        names it. Returns what was undone; the caller deletes a dropped space's vector file."""
        with self.db.write() as db:
            backfill = self.active_in(db)
            if backfill is None:
                raise UserError(
                    "no backfill is running in this store; there is nothing to abort",
                    hint="`modelupgrade store-status` shows the store's last backfill",
                )
            moved = int(
                db.execute(
                    "SELECT COUNT(*) FROM current_items WHERE backfill_id = ? AND space = ?",
                    (backfill.id, backfill.target_space),
                ).fetchone()[0]
            )
            serving = Database.meta(db, _SERVING_BEFORE) or backfill.source_space
            db.execute(
                "UPDATE items SET space = ?, state = 'idle', backfill_id = NULL, "
                "planned_chunk = NULL, backfill_rank = NULL, committed_chunk = NULL, "
                "failure = NULL WHERE backfill_id = ?",
                (backfill.source_space, backfill.id),
            )
            db.execute("DELETE FROM chunk_log WHERE backfill_id = ?", (backfill.id,))
            db.execute("DELETE FROM backfills WHERE id = ?", (backfill.id,))
            Database.set_meta(db, "serving_space", serving)
            db.execute("DELETE FROM meta WHERE key = ?", (_SERVING_BEFORE,))
            still_named = db.execute(
                "SELECT (SELECT COUNT(*) FROM items WHERE space = ?) + (SELECT COUNT(*) FROM "
                "backfills WHERE source_space = ? OR target_space = ?)",
                (backfill.target_space,) * 3,
            ).fetchone()[0]
            dropped = not still_named and backfill.target_space != serving
            storage = db.execute(
                "SELECT storage FROM spaces WHERE name = ?", (backfill.target_space,)
            ).fetchone()
            if dropped:
                db.execute("DELETE FROM spaces WHERE name = ?", (backfill.target_space,))
                if storage is not None:
                    # its vectors are dropped next; a writer killed first leaves this for the next
                    record_intent(db, "discard", DiscardIntent(storage[0]))
            record = AbortRecord(
                backfill_id=backfill.id,
                source_space=backfill.source_space,
                target_space=backfill.target_space,
                items=backfill.total,
                items_moved_back=moved,
                serving_space=serving,
                target_space_dropped=dropped,
                target_storage=None if storage is None else storage[0],
                started_at=backfill.started_at,
                aborted_at=time.time(),
            )
            Database.set_meta(db, _LAST_ABORTED, json.dumps(record.as_dict()))
        return record

    def last_aborted(self) -> AbortRecord | None:
        """What the store's last abort undid (None before any)."""
        with self.db.lock:
            found = Database.meta(self.db.connection, _LAST_ABORTED)
        return None if found is None else AbortRecord(**json.loads(found))

    # ----- audit --------------------------------------------------------------------------------
    def settled(self, backfill: Backfill) -> int:
        """Items of ``backfill`` that no longer wait: written (the chunk log's counts, a few rows
        a chunk, not a pass over the items) or failed."""
        with self.db.read() as db:
            written = db.execute(
                "SELECT COALESCE(SUM(written), 0) FROM chunk_log WHERE backfill_id = ?",
                (backfill.id,),
            ).fetchone()[0]
            failed = db.execute(
                "SELECT COUNT(*) FROM items WHERE state = 'failed' AND backfill_id = ?",
                (backfill.id,),
            ).fetchone()[0]
        return int(written) + int(failed)

    def failed_items(self) -> list[ItemFailure]:
        rows = self.db.query(
            "SELECT item_id, failure FROM items WHERE state = 'failed' ORDER BY backfill_rank"
        )
        return [ItemFailure(item_id, reason) for item_id, reason in rows]

    def completed_into(self, target: str) -> Backfill | None:
        """The store's last backfill when it is complete, into ``target``, and every item is in
        ``target`` (a re-run of it has nothing to do); None otherwise."""
        with self.db.read() as db:
            last = self.last_in(db)
            if last is None or last.status != "complete" or last.target_space != target:
                return None
            elsewhere = db.execute(
                "SELECT COUNT(*) FROM items WHERE space != ?", (target,)
            ).fetchone()[0]
        return None if elsewhere else last

    def still_planned(self, chunk: Chunk) -> set[int]:
        """The slots of ``chunk``'s items that are still pending in it now (an item erased, or
        updated and queued again, since the chunk was read has left it)."""
        slots = [item.slot for item in chunk.items]
        found: set[int] = set()
        for start in range(0, len(slots), 900):
            part = slots[start : start + 900]
            found |= {
                row[0]
                for row in self.db.query(
                    "SELECT slot FROM items WHERE state = 'pending' AND backfill_id = ? AND "
                    f"planned_chunk = ? AND slot IN ({','.join('?' * len(part))})",
                    [chunk.backfill_id, chunk.index, *part],
                )
            }
        return found

    def chunk_log(self, backfill_id: int | None = None) -> list[ChunkLogRow]:
        """The committed chunks (of one backfill, or of all), in commit order."""
        query = f"SELECT {_columns(ChunkLogRow)} FROM chunk_log"
        if backfill_id is None:
            rows = self.db.query(query + " ORDER BY backfill_id, chunk")
        else:
            rows = self.db.query(query + " WHERE backfill_id = ? ORDER BY chunk", (backfill_id,))
        return _records(ChunkLogRow, rows)

    def item_states(self) -> list[ItemStateRow]:
        """Every item's id, space, state and committing chunk (for audits and tests)."""
        rows = self.db.query(f"SELECT {_columns(ItemStateRow)} FROM current_items ORDER BY slot")
        return _records(ItemStateRow, rows)
