"""What can go wrong under a store that is nobody's bad input, as one error line each; and the named
commit boundaries a fault-injection test kills a writer at.

A damaged database (``StoreDamaged``) and a full disk (``DiskFull``) are ``UserError``s: the command
prints one line with a hint and exits 2, the service answers 503, and nothing half-written is left
(SQLite rolls the transaction back; vectors are only ever pointed at after they are stored).

``boundary(name)`` marks a point between two durable steps of a writer (``tests/test_store_faults``
lists them). With ``MODELUPGRADE_KILL_AT=name`` (or ``name#n``: its n-th passage) in the
environment, the process SIGKILLs itself there, the way a power cut or the OOM killer would stop
it; otherwise it costs a dictionary lookup.
"""

from __future__ import annotations

import errno
import os
import signal
import sqlite3
from collections import Counter
from pathlib import Path

from modelupgrade.errors import UserError

KILL_ENV = "MODELUPGRADE_KILL_AT"
_passed: Counter[str] = Counter()


def boundary(name: str) -> None:
    """A commit boundary: SIGKILL this process here when ``MODELUPGRADE_KILL_AT`` names it."""
    wanted = os.environ.get(KILL_ENV)
    if not wanted:
        return
    point, _, nth = wanted.partition("#")
    if point != name:
        return
    _passed[name] += 1
    if _passed[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


class StoreDamaged(UserError):
    """The store's database cannot be read as it was written (a damaged page, a file that is no
    database, a broken index): nothing it says can be trusted until it is repaired."""


class DiskFull(UserError):
    """The disk under the store has no room for what a writer must store; nothing was committed."""


_NEARLY_FULL = 1 << 20  # bytes free below which an SQLite I/O error is taken for a full disk


def damaged(path: Path, err: sqlite3.DatabaseError) -> UserError:
    """The error line of an SQLite failure on the store at ``path``: a full disk, a lock held too
    long, or damage."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    free = _free_bytes(path)
    # SQLite says "disk I/O error", not "full", when the disk fills while it extends its WAL or
    # shared-memory file: with (almost) nothing free, that is a full disk, not damage.
    if "full" in text or ("disk I/O error" in text and free is not None and free < _NEARLY_FULL):
        return DiskFull(
            f"the disk under the store at {path} is full: {text}; nothing was committed",
            hint="free space on that disk and run the command again (it resumes where it stopped)",
        )
    if "locked" in text or "busy" in text:
        return UserError(
            f"the store's database at {path} stayed locked by another process: {text}",
            hint="a writer held it longer than the wait allows; run the command again",
        )
    return StoreDamaged(
        f"the store's database at {path} is damaged: {text}",
        hint=f"`modelupgrade store-verify --store {path}` reports what is damaged; restore the "
        "store from a backup or rebuild it",
    )


def disk_full(path: Path, needed: int, err: OSError) -> DiskFull:
    """``err`` (ENOSPC, EDQUOT or EFBIG) met while storing ``needed`` bytes under ``path``."""
    free = _free_bytes(path)
    room = f"{free / 2**20:,.1f} MiB free" if free is not None else "free space unknown"
    return DiskFull(
        f"no room to store {needed / 2**20:,.1f} MiB of vectors under {path} ({room}): "
        f"{os.strerror(err.errno or errno.ENOSPC)}; nothing was committed",
        hint="free at least that much on that disk and run the command again (it resumes where "
        "it stopped)",
    )


def is_disk_full(err: OSError) -> bool:
    return err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _free_bytes(path: Path) -> int | None:
    for candidate in (path, *path.parents):
        try:
            stats = os.statvfs(candidate)
        except OSError:
            continue
        return stats.f_bavail * stats.f_frsize
    return None
