"""What the next writer does about a writer that died half-way: it finishes or undoes its work
before it writes anything itself (``GalleryStore.committing`` runs ``recover`` under the commit
lock).

* the vector journal: rows made durable only there are redone in place (``VectorBackend.recover``);
* rows stored at slots no committed item has reached yet (an ingest killed before its commit: a
  copy of its vectors no erasure would ever reach) are removed (``VectorBackend.discard_beyond``);
* write-ahead intents (a Milvus alias move and the database's record of it) are completed
  (``modelupgrade.store.intents``);
* orphan slots (an erased item's, an updated item's old one) have their vectors destroyed in every
  space (``modelupgrade.store.orphans``);
* a store directory an earlier modelupgrade built aside and never renamed into place
  (``.<name>.*.tmp`` beside it) is deleted once no writer holds it.

The journal and the slots are checked only when the last holder of the commit lock died holding it
(or on a process's first write step); intents and orphans, cheap to look for, every time.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from modelupgrade.store.backends.base import VectorBackend
from modelupgrade.store.database import Database
from modelupgrade.store.intents import complete_intents
from modelupgrade.store.lock import COMMIT_LOCK_FILE, LOCK_FILE
from modelupgrade.store.orphans import destroy_orphans
from modelupgrade.store.spaces import SpaceSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recovered:
    """What a recovery redid or removed (all zeros: there was nothing to do)."""

    rows_replayed: int = 0
    rows_discarded: int = 0
    intents_completed: int = 0
    slots_destroyed: int = 0
    builds_removed: int = 0

    def __bool__(self) -> bool:
        return any(vars(self).values())


def recover(
    database: Database,
    vectors: VectorBackend,
    spaces: dict[str, SpaceSpec],
    next_slot: int,
    thorough: bool,
) -> Recovered:
    """Finish or undo what a dead writer left in the store of ``database`` (see the module); the
    caller holds the commit lock. ``thorough``: also the journal, the slots past ``next_slot`` and
    builds left aside."""
    replayed = discarded = removed = 0
    if thorough:
        replayed = vectors.recover()
        discarded = vectors.discard_beyond(list(spaces.values()), next_slot)
        removed = remove_abandoned_builds(database.path)
    done = Recovered(
        replayed,
        discarded,
        complete_intents(database, vectors, spaces),
        destroy_orphans(database, vectors, list(spaces.values())),
        removed,
    )
    if done:
        log.warning("recovered what a writer that died left in %s: %s", database.path, done)
    return done


def remove_abandoned_builds(path: Path) -> int:
    """Delete ``.<name>.*.tmp`` directories beside the store ``path``: stores an earlier
    modelupgrade built aside for a rename that a killed process never made (each held every vector
    and the item table of an ingest). One whose writer still runs holds its lock and is kept."""
    removed = 0
    for build in path.parent.glob(f".{path.name}.*.tmp"):
        inner = build / path.name
        if build.is_dir() and _unlocked(inner) and _unlocked(build):
            shutil.rmtree(build, ignore_errors=True)
            removed += 1
    return removed


def _unlocked(directory: Path) -> bool:
    """Whether no process holds a writer lock of a store in ``directory``."""
    for name in (LOCK_FILE, COMMIT_LOCK_FILE):
        lock = directory / name
        if not lock.exists():
            continue
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        finally:
            os.close(fd)
    return True
