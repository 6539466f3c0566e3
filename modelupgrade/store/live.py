"""Live writes beyond an ingest: erase items and update their content, at any moment (a backfill
running or not), each a writer under the store's commit lock and crash-safe.

**Erase.** One transaction deletes the items' rows and scores (their ids, source paths, labels,
failure reasons) and records the erasure (when, who, why, how many: never which items); from then
on no snapshot holds them, so no search, status or backfill meets them again, and a backfill's
commit leaves them out. Their slots become *orphans*: the vectors stored there, in every space, are
destroyed next (overwritten on disk, deleted and compacted in Milvus; the vector journal, which may
hold a copy, is checkpointed and emptied first). A writer killed in between leaves the orphans to
the next writer, which destroys them before it writes anything (``recovery``). SQLite overwrites
the deleted rows (``secure_delete``) and its write-ahead log is checkpointed and emptied.

**Update.** An item whose content changed gets a new slot (copy on write): its new vectors are
stored there in every space that keeps a vector of it (the one it is served from; during a
backfill the backfill's source too, which an abort returns to; after one, the other space of the
rollback window), then one transaction points the item at the new slot and orphans the old one.
During a backfill, an item whose new vector in the backfill's target is not given goes back into
the backfill (queued after its last chunk) and is served from its source space until the backfill
recomputes it. Either way no reader ever meets the item half-updated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.store.database import Database
from modelupgrade.store.faults import boundary
from modelupgrade.store.ledger import BackfillLedger
from modelupgrade.store.orphans import destroy_orphans, orphan
from modelupgrade.store.schema import Backfill, ItemSources
from modelupgrade.store.shown import labelled, utc
from modelupgrade.store.steps import UNIT_MEMBERS
from modelupgrade.store.steps import actor as current_actor
from modelupgrade.store.vectors import check_vectors

if TYPE_CHECKING:
    from modelupgrade.store.gallery import GalleryStore

log = logging.getLogger(__name__)

# What a holder record says an erasure runs (its command line would name the items).
ERASE_OPERATION = "erase items"


@dataclass(frozen=True)
class Erasure:
    """An erasure as the store records it: no item data."""

    id: int
    at: float
    actor: str
    reason: str
    items: int
    not_found: int
    destroyed: bool

    def as_dict(self) -> dict[str, object]:
        return {
            "erasure_id": self.id,
            "at": self.at,
            "actor": self.actor,
            "reason": self.reason,
            "items_erased": self.items,
            "ids_not_found": self.not_found,
            "vectors_destroyed": self.destroyed,
        }

    def describe(self) -> str:
        destroyed = (
            "destroyed in every space"
            if self.destroyed
            else "left for the next writer to destroy (it does so before it writes anything)"
        )
        return "\n".join(
            [
                f"erasure {self.id} recorded at {utc(self.at)} by {self.actor}: {self.reason}",
                labelled("items erased", f"{self.items:,} (their ids are not recorded)"),
                labelled(
                    "ids not found", f"{self.not_found:,} (never ingested, or erased already)"
                ),
                labelled("their vectors", destroyed),
            ]
        )


@dataclass(frozen=True)
class Update:
    """What an update did: items given new content, in which spaces, and how many went back into
    the running backfill."""

    items: int
    spaces: tuple[str, ...]
    requeued: int

    def as_dict(self) -> dict[str, object]:
        return {"items_updated": self.items, "spaces": list(self.spaces), "requeued": self.requeued}

    def describe(self) -> str:
        requeued = (
            " (served from the backfill's source space until it recomputes them)"
            if self.requeued
            else ""
        )
        return "\n".join(
            [
                f"{self.items:,} item(s) updated",
                labelled("new vectors in", ", ".join(self.spaces)),
                labelled("requeued", f"{self.requeued:,} into the running backfill{requeued}"),
            ]
        )


def _slots_of(store: GalleryStore, item_ids: Sequence[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    ids = list(dict.fromkeys(str(i) for i in item_ids))
    for start in range(0, len(ids), 900):
        part = ids[start : start + 900]
        found.update(
            store.db.query(
                f"SELECT item_id, slot FROM items WHERE item_id IN ({','.join('?' * len(part))})",
                part,
            )
        )
    return found


def erase(store: GalleryStore, item_ids: Sequence[str], reason: str) -> Erasure:
    """Erase the items named ``item_ids`` (see the module); ids the store does not hold (never
    ingested, or erased already) are counted, not an error: erasing twice is erasing once."""
    if not reason.strip():
        raise UserError(
            "an erasure needs a reason: it is recorded with who asked and when",
            hint='pass --reason "…" (e.g. the request that asks for it)',
        )
    with store.committing(ERASE_OPERATION):
        found = _slots_of(store, item_ids)
        slots = sorted(found.values())
        now, who = time.time(), current_actor()
        with store.db.write(items_changed=True) as db:
            db.execute("PRAGMA secure_delete = ON")
            erasure_id = int(
                db.execute(
                    "INSERT INTO erasures (at, actor, reason, items) VALUES (?, ?, ?, ?)",
                    (now, who, reason.strip(), len(slots)),
                ).lastrowid
                or 0
            )
            orphan(db, slots, "erase", erasure_id)
        boundary("erase:recorded")
        destroyed = destroy_orphans(store.db, store.vectors, list(store.spaces().values())) >= 0
    _empty_the_log(store)
    log.info("erasure %d: %d item(s) erased (%s)", erasure_id, len(slots), reason.strip())
    return Erasure(
        erasure_id,
        now,
        who,
        reason.strip(),
        len(slots),
        len(set(item_ids)) - len(found),
        destroyed,
    )


def _empty_the_log(store: GalleryStore) -> None:
    """Checkpoint SQLite's write-ahead log into the database and truncate it: the log holds the
    pages an erasure overwrote as they were before. A reader holding an old snapshot can keep it
    from emptying; it is tried a few times, then left to the next checkpoint (and said so)."""
    for _ in range(20):
        busy, _, _ = store.db.query("PRAGMA wal_checkpoint(TRUNCATE)")[0]
        if not busy:
            return
        time.sleep(0.05)
    log.warning(
        "a reader of %s kept SQLite's write-ahead log from being emptied; the pages the erasure "
        "overwrote stay in it until its next checkpoint",
        store.path,
    )


@dataclass(frozen=True)
class LiveSpaces:
    """Which spaces keep a vector of an item, read once for a batch of items: the running
    backfill, and the complete backfills of the last one's serving unit (while a backfill that
    continues a unit runs, the items its earlier backfills moved keep both vectors too)."""

    active: Backfill | None
    last: Backfill | None
    unit: frozenset[int]
    held: frozenset[str]

    @classmethod
    def read(cls, store: GalleryStore, active: Backfill | None) -> LiveSpaces:
        last = store.backfills.last()
        unit = frozenset(
            int(row[0])
            for row in store.db.query(
                f"SELECT id FROM backfills WHERE id IN ({UNIT_MEMBERS}) AND status = 'complete'",
                (-1 if last is None else last.unit,),
            )
        )
        return cls(active, last, unit, frozenset(store.spaces()))

    def of(self, current: str, backfill_id: int | None) -> set[str]:
        """The spaces that keep a vector of an item served from ``current`` and planned in
        backfill ``backfill_id``: ``current``; during a backfill that planned it, its source too;
        after a complete backfill of the last one's unit moved it, both of its spaces until a
        cleanup drops the old one."""
        spaces = {current}
        if self.active is not None and backfill_id == self.active.id:
            return spaces | {self.active.source_space}
        if self.last is not None and backfill_id in self.unit:
            spaces |= {self.last.source_space, self.last.target_space} & self.held
        return spaces


def update(
    store: GalleryStore,
    item_ids: Sequence[str],
    vectors: Mapping[str, np.ndarray],
    sources: ItemSources | None = None,
    content: Mapping[str, np.ndarray] | None = None,
) -> Update:
    """Give the items of ``item_ids`` new content: ``vectors`` maps each space that keeps a vector
    of them to their new vectors (row i: item i), ``content`` the content hashes those were made
    from, ``sources`` where the new content is (see the module)."""
    ids = [str(i) for i in item_ids]
    if len(set(ids)) != len(ids):
        raise UserError("the item ids to update are not unique")
    with store.committing("update items"):
        rows = _current_rows(store, ids)
        active = store.backfills.active()
        given = {
            space: check_vectors(v, store.space(space), f"vectors for {space!r}")
            for space, v in vectors.items()
        }
        requeue = _checked_spaces(store, ids, rows, given, active)
        first = store.next_slot()
        new_slots = np.arange(first, first + len(ids), dtype=np.int64)
        store.vectors.reserve(list(store.spaces().values()), first + len(ids))
        for space, array in given.items():
            if len(array) != len(ids):
                raise UserError(f"{len(array)} vectors in {space!r} for {len(ids)} items")
            store.write_vectors(
                space,
                new_slots,
                array,
                content=None if content is None else content.get(space),
                item_ids=ids,
            )
        boundary("update:vectors")
        source_rows = None if sources is None else list(sources.rows(len(ids)))
        with store.db.write(items_changed=True) as db:
            # the item's scores follow it to its new slot within the transaction
            db.execute("PRAGMA defer_foreign_keys = ON")
            taken = Database.take_counter(db, "next_slot", len(ids))
            if taken != first:
                raise RuntimeError(f"slot counter moved from {first} to {taken} under the lock")
            for position, item_id in enumerate(ids):
                old, new = rows[item_id][0], int(new_slots[position])
                db.execute("UPDATE items SET slot = ? WHERE slot = ?", (new, old))
                db.execute("UPDATE item_scores SET slot = ? WHERE slot = ?", (new, old))
                if source_rows is not None:
                    path, index, label = source_rows[position]
                    db.execute(
                        "UPDATE items SET source_path = ?, source_index = ?, label = ? "
                        "WHERE slot = ?",
                        (path, index, label, new),
                    )
            if requeue and active is not None:
                again = np.array([new_slots[ids.index(i)] for i in ids if i in requeue], np.int64)
                db.executemany(
                    "UPDATE items SET space = ? WHERE slot = ?",
                    ((active.source_space, int(slot)) for slot in again),
                )
                BackfillLedger.queue(db, active, again)
            orphan(db, [rows[i][0] for i in ids], "update", None)
        boundary("update:committed")
        destroy_orphans(store.db, store.vectors, list(store.spaces().values()))
    return Update(len(ids), tuple(sorted(given)), len(requeue))


def _current_rows(store: GalleryStore, ids: list[str]) -> dict[str, tuple[int, str, int | None]]:
    """(slot, current space, backfill id) of each item, all of which must exist."""
    found: dict[str, tuple[int, str, int | None]] = {}
    for start in range(0, len(ids), 900):
        part = ids[start : start + 900]
        for item_id, slot, space, backfill_id in store.db.query(
            "SELECT item_id, slot, space, backfill_id FROM current_items WHERE item_id IN "
            f"({','.join('?' * len(part))})",
            part,
        ):
            found[item_id] = (int(slot), str(space), backfill_id)
    missing = [i for i in ids if i not in found]
    if missing:
        raise UserError(
            f"{len(missing)} item id(s) to update are not in the store, e.g. {missing[0]!r}",
            hint="`modelupgrade store-ingest` adds new items",
        )
    return found


def _checked_spaces(
    store: GalleryStore,
    ids: list[str],
    rows: dict[str, tuple[int, str, int | None]],
    given: Mapping[str, np.ndarray],
    active: Backfill | None,
) -> set[str]:
    """The items that go back into the running backfill: those it has not moved yet (their new
    source vector must be computed again into its target) and those whose new target vector is not
    given. Every other space that keeps a vector of an item must get its new one."""
    requeue: set[str] = set()
    kept = LiveSpaces.read(store, active)
    for item_id in ids:
        _, current, backfill_id = rows[item_id]
        live = kept.of(current, backfill_id)
        planned = active is not None and backfill_id == active.id
        if planned and active is not None:
            moved = current == active.target_space
            if not moved or active.target_space not in given:
                requeue.add(item_id)
                live.discard(active.target_space)
            else:
                live.add(active.target_space)
        missing, extra = live - set(given), set(given) - live
        if missing or extra:
            what = (
                f"its vectors in {sorted(missing)} are missing"
                if missing
                else f"it keeps no vector in {sorted(extra)} now"
            )
            raise UserError(
                f"item {item_id!r} is kept in spaces {sorted(live)}: {what}",
                hint="give the item's new vectors in each space that keeps one (--vectors "
                "SPACE=FILE); during a backfill, its target's vector is computed by the backfill",
            )
    return requeue
