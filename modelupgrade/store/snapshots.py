"""Snapshots: which space serves each item at one committed moment, and how a vector database picks
each space's part by a filter of constant size.

**Reading one cheaply.** A snapshot is read in one transaction, but a backfill's chunk commit does
not rewrite item rows (``schema.CURRENT_ITEMS_DDL``): it appends to the chunk log. An item still
pending in a running backfill is in the backfill's target once its chunk is committed, and chunks
commit in plan order (a group commit commits a run of consecutive chunks; retried, re-queued and
newly queued items get chunks after the last), so the committed ones are exactly the planned chunks
up to the highest committed one, the *frontier*. The item rows themselves change only when items do
(an ingest, an update, an erasure, a plan, an abort, a step; the ``items_epoch`` counter moves); a
reader keeps the item table it read until then and derives each item's space from it and the
frontier with a few vector operations per commit, rather than reading every row per commit.

**The part filters.** Every row of a space's collection in a vector database (``backends.milvus``)
records the write that made it authoritative (``wb``, ``wc``: backfill and chunk; 0 for an ingest
or an update) and, in the source space of a backfill, the move that took its item out (``mb``,
``mc``). Which rows form a space's part is then a function of a handful of ledger facts, not of
the items: the slot counter, the running backfill and its frontier, and which complete backfills
are in effect (not rolled back). ``part_filter`` writes it as an expression whose size grows with
the number of backfills that touched the space (one or two), never with the number of items. Rows
stored ahead of their commit (a chunk being written, an ingest not yet committed) are past the
frontier or the slot counter, hence outside every part until their commit; rows of an aborted
backfill name a backfill id that is never used again.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelupgrade.json_data import JsonObject
from modelupgrade.store.database import Database
from modelupgrade.store.ledger import BackfillLedger
from modelupgrade.store.schema import Backfill, Snapshot
from modelupgrade.store.spaces import SpaceSpec
from modelupgrade.store.steps import UNIT_LAST_STEP


@dataclass(frozen=True)
class ItemTable:
    """The item rows as of one items epoch: slot order, each row's own space (a code into
    ``names``) and its place in a backfill's plan."""

    epoch: int
    slots: np.ndarray
    item_ids: np.ndarray
    codes: np.ndarray
    names: tuple[str, ...]
    pending: np.ndarray
    backfill: np.ndarray
    chunk: np.ndarray


def read_items(db: sqlite3.Connection, epoch: int) -> ItemTable:
    rows = db.execute(
        "SELECT slot, item_id, space, state = 'pending', COALESCE(backfill_id, -1), "
        "COALESCE(planned_chunk, -1) FROM items ORDER BY slot"
    ).fetchall()
    names = tuple(sorted({row[2] for row in rows}))
    code = {name: i for i, name in enumerate(names)}
    count = len(rows)
    return ItemTable(
        epoch,
        np.fromiter((r[0] for r in rows), np.int64, count),
        np.array([r[1] for r in rows], dtype=object),
        np.fromiter((code[r[2]] for r in rows), np.int16, count),
        names,
        np.fromiter((bool(r[3]) for r in rows), bool, count),
        np.fromiter((r[4] for r in rows), np.int64, count),
        np.fromiter((r[5] for r in rows), np.int64, count),
    )


@dataclass(frozen=True)
class LedgerFacts:
    """What the part filters depend on: the slot counter, the running backfill and its frontier,
    every backfill's spaces and whether it is in effect, and slots waiting to be destroyed."""

    next_slot: int
    active: Backfill | None
    frontier: int
    in_effect: tuple[tuple[int, str, str], ...]  # (id, source, target) of complete backfills
    orphans: tuple[int, ...]


def read_facts(db: sqlite3.Connection, active: Backfill | None) -> LedgerFacts:
    frontier = -1
    if active is not None:
        frontier = int(
            db.execute(
                "SELECT COALESCE(MAX(chunk), -1) FROM chunk_log WHERE backfill_id = ?", (active.id,)
            ).fetchone()[0]
        )
    # A complete backfill is in effect unless the last step on its serving unit rolled it back.
    in_effect = tuple(
        (int(row[0]), row[1], row[2])
        for row in db.execute(
            "SELECT b.id, b.source_space, b.target_space FROM backfills AS b WHERE "
            f"b.status = 'complete' AND COALESCE({UNIT_LAST_STEP}, '') != 'rollback' ORDER BY b.id"
        )
    )
    orphans = tuple(int(row[0]) for row in db.execute("SELECT slot FROM orphan_slots"))
    return LedgerFacts(
        int(Database.meta(db, "next_slot") or 0), active, frontier, in_effect, orphans
    )


def part_filter(space: str, facts: LedgerFacts) -> str:
    """The rows of ``space``'s collection that hold its part's items (see the module)."""
    written = ["wb == 0"]
    written += [f"wb == {b}" for b, _, target in facts.in_effect if target == space]
    moved = [f"mb == {b}" for b, source, _ in facts.in_effect if source == space]
    active = facts.active
    if active is not None:
        if active.target_space == space:
            written.append(f"(wb == {active.id} and wc <= {facts.frontier})")
        if active.source_space == space:
            moved.append(f"(mb == {active.id} and mc <= {facts.frontier})")
    expression = f"slot < {facts.next_slot} and ({' or '.join(written)})"
    if moved:
        expression += f" and not ({' or '.join(moved)})"
    if facts.orphans:
        # erased or replaced a moment ago, their vectors about to be destroyed
        expression += f" and slot not in [{','.join(map(str, facts.orphans))}]"
    return expression


def current_codes(table: ItemTable, active: Backfill | None, frontier: int) -> np.ndarray:
    """Each item's current space (a code into ``table.names``, which gains the running
    backfill's target): its row's, or the target once its planned chunk is committed."""
    codes = table.codes
    if active is None or frontier < 0:
        return codes
    moved = table.pending & (table.backfill == active.id) & (table.chunk <= frontier)
    if not moved.any():
        return codes
    codes = codes.copy()
    codes[moved] = _code(table, active.target_space)
    return codes


def _code(table: ItemTable, name: str) -> int:
    return table.names.index(name) if name in table.names else len(table.names)


def read_snapshot(database: Database, cached: ItemTable | None) -> tuple[Snapshot, ItemTable]:
    """The store's snapshot, read in one transaction, reusing ``cached`` when no item row changed
    since it was read; returns the item table it used too."""
    with database.read() as db:
        counter = int(Database.meta(db, "commit_counter") or 0)
        epoch = int(Database.meta(db, "items_epoch") or 0)
        serving = Database.meta(db, "serving_space")
        active = BackfillLedger.active_in(db)
        table = cached if cached is not None and cached.epoch == epoch else read_items(db, epoch)
        facts = read_facts(db, active)
    codes = current_codes(table, active, facts.frontier)
    names = table.names
    if active is not None and active.target_space not in names:
        names = (*names, active.target_space)
    snapshot = Snapshot(
        slots=table.slots,
        item_ids=table.item_ids,
        spaces=np.asarray(names, dtype=object)[codes] if len(codes) else np.empty(0, object),
        serving_space=serving,
        active_backfill=active,
        commit_counter=counter,
        codes=codes,
        names=names,
        filters={name: part_filter(name, facts) for name in names},
    )
    return snapshot, table


def serving_state(database: Database, spaces: dict[str, SpaceSpec], vectors: Any) -> JsonObject:
    """What a reader that knows only the vector database needs to search the store as its own
    readers do (docs/store.md, "Serving replicas"): per space its collection, dimension, form
    and the filter of its part; which space serves (its part is the new side of a rank merge,
    every other the old side); the write every search must wait for (``guarantee_timestamp``);
    the commit it describes."""
    with database.read() as db:
        facts = read_facts(db, BackfillLedger.active_in(db))
        serving = Database.meta(db, "serving_space")
        counter = int(Database.meta(db, "commit_counter") or 0)
        mark = int(Database.meta(db, "vector_mark") or 0)
    return {
        "format": "modelupgrade-serving-state/1",
        "commit_counter": counter,
        "serving_space": serving,
        "guarantee_timestamp": mark,
        "metric": vectors.metric,
        "spaces": {
            name: {
                "collection": vectors.collection(spec),
                "dim": spec.dim,
                "form": spec.form,
                "filter": part_filter(name, facts),
            }
            for name, spec in spaces.items()
            if spec.storage in vectors.known_storages()
        },
    }
