"""``modelupgrade store-verify``: is the store what its writers committed?

It checks, and reports each finding on one line:

* **database**: SQLite's ``integrity_check`` (every page, every index against its table);
* **items**: the item table against its constraints, read by a full scan (not through the index a
  damaged file could hide a duplicate behind): unique ids, slots below the slot counter, states a
  backfill could leave, spaces the store holds, no item on a slot waiting to be destroyed;
* **ledger**: a running backfill's chunk log is a prefix of its plan (what search relies on);
* **vectors**: every vector an item is served from, and every one kept for an abort or a rollback,
  against the checksum and the space recorded with it when it was written;
* **backend**: the vectors the backend holds against the spaces the store names (nothing left of a
  dropped space, nothing of a named one missing), no vector left on a destroyed slot or past the
  last item (nothing resurrected), and the Milvus serving alias against the recorded cutover;
* **pending**: work a writer that died left for the next one (an intent, orphan slots, a
  journal): not damage, but said.

``verify`` reads only (no lock); ``quick_check`` is the cheap subset a service runs when it opens a
store: the database's ``quick_check``, the backend against the spaces, and a sample of vectors.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from modelupgrade.json_data import JsonObject
from modelupgrade.store.backends.base import VectorsUnavailable
from modelupgrade.store.faults import StoreDamaged
from modelupgrade.store.spaces import SpaceSpec
from modelupgrade.store.steps import UNIT_LAST_STEP

if TYPE_CHECKING:
    from modelupgrade.store.gallery import GalleryStore

EXIT_INCONSISTENT = 1
# Slots read per batch when every vector is checked.
_BATCH = 65536
# Vectors a quick check samples per space.
QUICK_SAMPLE = 256
_SHOWN = 5


@dataclass(frozen=True)
class Check:
    """One kind of check: how many things it looked at and what it found wrong."""

    name: str
    checked: int
    problems: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.problems


@dataclass
class VerifyReport:
    store: str
    checks: list[Check] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)

    @property
    def inconsistencies(self) -> int:
        return sum(len(check.problems) for check in self.checks)

    @property
    def exit_code(self) -> int:
        return EXIT_INCONSISTENT if self.inconsistencies else 0

    @property
    def exit_message(self) -> str | None:
        if not self.inconsistencies:
            return None
        first = next(c for c in self.checks if c.problems)
        return (
            f"{self.inconsistencies} inconsistenc{'y' if self.inconsistencies == 1 else 'ies'} "
            f"in the store at {self.store}, e.g. {first.name}: {first.problems[0]}\n  hint: "
            "restore the store from a backup, or rebuild the damaged part (a space: backfill it "
            "again; the database: ingest into a new store)"
        )

    def as_dict(self) -> JsonObject:
        return {
            "store": self.store,
            "inconsistencies": self.inconsistencies,
            "checks": [
                {
                    "check": c.name,
                    "checked": c.checked,
                    "passed": c.passed,
                    "problems": list(c.problems),
                }
                for c in self.checks
            ],
            "pending": list(self.pending),
        }

    def describe(self) -> str:
        lines = [f"store {self.store}: {self.inconsistencies} inconsistencies"]
        for check in self.checks:
            mark = "ok " if check.passed else "BAD"
            lines.append(f"  {mark} {check.name}: {check.checked:,} checked")
            lines += [f"        {problem}" for problem in check.problems]
        lines += [f"  note {line}" for line in self.pending]
        return "\n".join(lines)

    def as_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


def _shown(problems: list[str]) -> tuple[str, ...]:
    more = len(problems) - _SHOWN
    return tuple(problems[:_SHOWN] + ([f"... and {more} more"] if more > 0 else []))


def verify(store: GalleryStore, sample: int | None = None) -> VerifyReport:
    """Every check of the module (``sample``: check that many vectors per space, not all)."""
    report = VerifyReport(str(store.path))
    database = _database_check(store, full=sample is None)
    report.checks.append(database)
    if not database.passed:
        return report  # nothing else the database says can be trusted
    report.checks += [_items_check(store), _ledger_check(store)]
    report.pending = _pending(store)
    try:
        store.vectors.reachable()
    except VectorsUnavailable as err:
        # Not damage: the vectors cannot be checked now (a server down, a Lite file held).
        report.pending.append(f"the vectors were not checked: {err.message}")
        return report
    report.checks.append(_vectors_check(store, sample))
    report.checks.append(_backend_check(store, sample is None, report.pending))
    return report


def quick_check(store: GalleryStore) -> VerifyReport:
    """The cheap subset a service runs when it opens a store (see the module)."""
    return verify(store, sample=QUICK_SAMPLE)


def _database_check(store: GalleryStore, full: bool) -> Check:
    pragma = "integrity_check(20)" if full else "quick_check(20)"
    try:
        rows = [row[0] for row in store.db.query(f"PRAGMA {pragma}")]
    except StoreDamaged as err:
        return Check("database", 1, (err.message,))
    pages = int(store.db.query("PRAGMA page_count")[0][0])
    return Check("database", pages, () if rows == ["ok"] else _shown(rows))


def _items_check(store: GalleryStore) -> Check:
    problems: list[str] = []
    rows = store.db.query(
        "SELECT slot, item_id, space, state, backfill_id FROM items NOT INDEXED ORDER BY slot"
    )
    counts = Counter(row[1] for row in rows)
    problems += [f"item id {i!r} is held by {n} items" for i, n in counts.items() if n > 1]
    next_slot = store.next_slot()
    spaces = set(store.spaces())
    active = store.backfills.active()
    orphans = {row[0] for row in store.db.query("SELECT slot FROM orphan_slots")}
    for slot, item_id, space, state, backfill_id in rows:
        if slot >= next_slot:
            problems.append(f"item {item_id!r} is on slot {slot}, past the counter {next_slot}")
        if space not in spaces:
            problems.append(f"item {item_id!r} is in space {space!r}, which the store lacks")
        if state == "pending" and (active is None or backfill_id != active.id):
            problems.append(f"item {item_id!r} is pending in no running backfill")
        if slot in orphans:
            problems.append(f"item {item_id!r} is on slot {slot}, which waits to be destroyed")
    scored = store.db.query(
        "SELECT COUNT(*) FROM item_scores WHERE slot NOT IN (SELECT slot FROM items)"
    )[0][0]
    if scored:
        problems.append(f"{scored} ordering score(s) belong to no item")
    return Check("items", len(rows), _shown(problems))


def _ledger_check(store: GalleryStore) -> Check:
    active = store.backfills.active()
    if active is None:
        return Check("ledger", 0)
    committed = [
        row[0]
        for row in store.db.query(
            "SELECT chunk FROM chunk_log WHERE backfill_id = ? ORDER BY chunk", (active.id,)
        )
    ]
    frontier = max(committed, default=-1)
    behind = store.db.query(
        "SELECT COUNT(*), MIN(planned_chunk) FROM items WHERE backfill_id = ? AND state = "
        "'pending' AND planned_chunk < ? AND planned_chunk NOT IN (SELECT chunk FROM chunk_log "
        "WHERE backfill_id = ?)",
        (active.id, frontier, active.id),
    )[0]
    problems = []
    if behind[0]:
        problems.append(
            f"{behind[0]} item(s) of backfill {active.id} are pending in chunk {behind[1]}, "
            f"before its committed chunk {frontier}"
        )
    return Check("ledger", len(committed), tuple(problems))


def kept_slots(store: GalleryStore) -> dict[str, np.ndarray]:
    """Space → the slots whose vector in it the store serves or keeps (an abort's or a
    rollback's): what must be stored there, whole."""
    kept: dict[str, set[int]] = {}
    for slot, space, backfill_id in store.db.query(
        "SELECT slot, space, backfill_id FROM current_items"
    ):
        kept.setdefault(space, set()).add(int(slot))
        for other in _also_kept(store, backfill_id):
            kept.setdefault(other, set()).add(int(slot))
    return {space: np.array(sorted(slots), dtype=np.int64) for space, slots in kept.items()}


def _also_kept(store: GalleryStore, backfill_id: int | None) -> tuple[str, ...]:
    if backfill_id is None:
        return ()
    cache = store.__dict__.setdefault("_verify_backfills", {})
    if backfill_id not in cache:
        found = store.db.query(
            "SELECT b.source_space, b.target_space, b.status, "
            f"COALESCE({UNIT_LAST_STEP}, '') FROM backfills AS b WHERE b.id = ?",
            (backfill_id,),
        )
        if not found or found[0][3] == "cleanup":
            cache[backfill_id] = ()
        else:
            source, target, status, _ = found[0]
            cache[backfill_id] = (source,) if status == "running" else (source, target)
    return cache[backfill_id]


def _vectors_check(store: GalleryStore, sample: int | None) -> Check:
    problems: list[str] = []
    checked = 0
    spaces = store.spaces()
    rng = np.random.default_rng(0)
    for space, slots in sorted(kept_slots(store).items()):
        if space not in spaces:
            continue
        if sample is not None and len(slots) > sample:
            slots = np.sort(rng.choice(slots, sample, replace=False))
        try:
            bad = store.vectors.mismatched(spaces[space], slots)
        except Exception as err:  # noqa: BLE001 - a vector that cannot be read is a finding
            message = getattr(err, "message", None) or f"{type(err).__name__}: {err}"
            problems.append(f"space {space!r}: {message}")
            continue
        checked += len(slots)
        problems += [
            f"space {space!r}, slot {slot}: the vector is not the one written" for slot in bad
        ]
    return Check("vectors", checked, _shown(problems))


def _backend_check(store: GalleryStore, every_slot: bool, notes: list[str]) -> Check:
    problems: list[str] = []
    spaces = store.spaces()
    cleaned = _cleaned_spaces(store)
    stored = store.vectors.stored()
    named = {spec.storage: name for name, spec in spaces.items() if name not in cleaned}
    dropping = {
        json.loads(detail).get("storage")
        for (detail,) in store.db.query(
            "SELECT detail FROM intents WHERE kind IN ('cleanup', 'discard')"
        )
    }
    for storage, space in sorted(stored.items()):
        if storage in dropping:
            notes.append(f"the vectors {storage} of a dropped space wait for the next writer")
        elif storage not in named:
            problems.append(
                f"the backend holds vectors ({storage}) of no space of the store ({space})"
            )
    for storage, space in sorted(named.items()):
        if storage not in stored:
            problems.append(f"the vectors of space {space!r} ({storage}) are missing")
    present = [spec for name, spec in spaces.items() if spec.storage in stored]
    gone = np.array([row[0] for row in store.db.query("SELECT slot FROM orphan_slots")], np.int64)
    if every_slot:
        problems += _resurrected(store, present, gone, notes)
    problems += store_alias_problems(store)
    return Check("backend", len(stored), _shown(problems))


def _cleaned_spaces(store: GalleryStore) -> set[str]:
    return {
        row[0]
        for row in store.db.query(
            "SELECT from_space FROM serving_steps s WHERE step = 'cleanup' AND id = (SELECT "
            "MAX(id) FROM serving_steps WHERE backfill_id = s.backfill_id)"
        )
    }


def _resurrected(
    store: GalleryStore, specs: list[SpaceSpec], pending: np.ndarray, notes: list[str]
) -> list[str]:
    """Vectors on slots no item holds and none waits to be destroyed on: an erased or replaced
    item's, a copy nothing would ever reach. Those past the slot counter were stored by a writer
    that died before its commit (what the next writer removes): a note, not damage."""
    held = np.array([row[0] for row in store.db.query("SELECT slot FROM items")], np.int64)
    present = getattr(store.vectors, "present_slots", None)
    if present is None:
        return []
    counter = store.next_slot()
    problems = []
    for spec in specs:
        stray = np.setdiff1d(np.setdiff1d(present(spec), held), pending)
        beyond = stray[stray >= counter]
        stray = stray[stray < counter]
        if len(beyond):
            notes.append(
                f"space {spec.name!r} holds {len(beyond)} vector(s) past the last committed item "
                "(a writer died before its commit); the next writer removes them"
            )
        if len(stray):
            problems.append(
                f"space {spec.name!r} holds {len(stray)} vector(s) of no item, e.g. slot "
                f"{int(stray[0])} (an erased or replaced item's)"
            )
    return problems


def store_alias_problems(store: GalleryStore) -> list[str]:
    """Whether the backend's serving alias (Milvus) points where the store's last step says."""
    pointed = getattr(store.vectors, "serving_collection", None)
    if pointed is None:
        return []
    steps = store.db.query(
        "SELECT step, to_space FROM serving_steps WHERE step IN ('cutover', 'rollback') "
        "ORDER BY id DESC LIMIT 1"
    )
    intents = store.db.query("SELECT COUNT(*) FROM intents")[0][0]
    actual = pointed()
    if not steps:
        if actual is None or intents:
            return []
        return [f"the serving alias points at {actual} before any cutover"]
    expected = getattr(store.vectors, "collection")(store.space(steps[0][1]))  # noqa: B009
    if actual != expected and not intents:
        last, space = steps[0]
        return [f"the serving alias points at {actual}, the last {last} at {expected} ({space!r})"]
    return []


def _pending(store: GalleryStore) -> list[str]:
    notes = []
    for (kind,) in store.db.query("SELECT kind FROM intents ORDER BY id"):
        notes.append(f"a {kind} was interrupted; the next writer completes it")
    orphans = store.db.query("SELECT COUNT(*) FROM orphan_slots")[0][0]
    if orphans:
        notes.append(
            f"{orphans} erased or replaced slot(s) wait for the next writer to destroy them"
        )
    if store.vectors.journals_left():
        notes.append("vectors wait in a journal for the next writer to redo (or a writer runs)")
    active = store.backfills.active()
    if active is not None:
        notes.append(f"backfill {active.id} into {active.target_space!r} is running")
    return notes
