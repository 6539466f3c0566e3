"""One writer per store: a cross-process lock that every writer holds and no reader takes.

A writer (a backfill, an ingest into an existing store, a retry, an abort) takes an exclusive
``flock`` on ``writer.lock`` next to the store's database and records who it is in
``writer.json`` (pid, host, command line, operation, since when). A second writer meets the lock
and reads the record, so its error names the holder. The kernel releases a ``flock`` when its
holder dies, SIGKILL included, so a stale lock cannot block anyone: the next writer gets the lock,
finds the dead holder's record and replaces it. Readers (search, status, the HTTP service) open
the store without touching either file.

The lock is re-entrant per ``WriterLock`` object (one per open ``GalleryStore``), so a backfill
command that holds it while it retries, plans and runs takes it once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from modelupgrade.errors import UserError

log = logging.getLogger(__name__)

LOCK_FILE = "writer.lock"
HOLDER_FILE = "writer.json"
F = TypeVar("F", bound=Callable[..., Any])

# The command line in a holder record is cut here: it is for a person to recognise the process.
_COMMAND_CHARS = 300


def _command_line() -> str:
    try:
        raw = Path(f"/proc/{os.getpid()}/cmdline").read_bytes()
        words = [w.decode(errors="replace") for w in raw.split(b"\0") if w]
    except OSError:
        words = [sys.executable, *sys.argv]
    text = " ".join(words)
    return text if len(text) <= _COMMAND_CHARS else text[: _COMMAND_CHARS - 1] + "…"


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe_holder(record: dict[str, Any] | None) -> str:
    """A holder record as a person reads it: pid, host, command, operation, since when."""
    if not record:
        return "another process (it has not recorded itself yet)"
    since = float(record.get("since", 0.0))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since))
    host = record.get("host", "?")
    where = "" if host == socket.gethostname() else f" on host {host}"
    return (
        f"pid {record.get('pid', '?')}{where} ({record.get('operation', '?')}: "
        f"`{record.get('command', '?')}`), since {stamp} ({time.time() - since:.0f} s ago)"
    )


class WriterLock:
    """The writer lock of the store in ``directory``; nothing is created until it is taken."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._fd: int | None = None
        self._depth = 0
        self._mutex = threading.Lock()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> dict[str, Any] | None:
        """The record of the last writer that took the lock (None if there is none)."""
        try:
            return json.loads((self.directory / HOLDER_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    @contextlib.contextmanager
    def hold(self, operation: str) -> Iterator[None]:
        """Hold the lock for the block; a second writer's attempt raises a ``UserError``."""
        self.acquire(operation)
        try:
            yield
        finally:
            self.release()

    def acquire(self, operation: str) -> None:
        with self._mutex:
            if self._fd is not None:
                self._depth += 1
                return
            fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                os.close(fd)
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise self._busy(operation) from None
            try:
                self._take_over(operation)
            except BaseException:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                raise
            self._fd, self._depth = fd, 1

    def release(self) -> None:
        with self._mutex:
            if self._fd is None:
                return
            self._depth -= 1
            if self._depth > 0:
                return
            # The record goes first: whoever takes the lock next finds no record of a live holder.
            (self.directory / HOLDER_FILE).unlink(missing_ok=True)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def _busy(self, operation: str) -> UserError:
        record = self.holder()
        holder = describe_holder(record)
        pid = record.get("pid") if record else None
        dead = (
            isinstance(pid, int)
            # record is not None where pid is an int
            and record.get("host") == socket.gethostname()  # type: ignore[union-attr]
            and not pid_alive(pid)
        )
        if dead:
            # A child that inherited the lock outlives the process that took it.
            holder += "; that pid has exited, a process it started still holds the lock"
        stop = (
            f"stop it (`kill -TERM {pid}`: a backfill stops at a chunk boundary and resumes when "
            "run again)"
            if isinstance(pid, int)
            else "stop it"
        )
        return UserError(
            f"cannot {operation}: the store at {self.directory} is being written by {holder}",
            hint=f"one writer at a time: wait for it to finish or {stop}; search, serve and "
            "store-status are not blocked",
        )

    def _take_over(self, operation: str) -> None:
        stale = self.holder()
        if stale is not None:
            log.warning(
                "the store's writer lock was left by %s, which ended without releasing it; "
                "taking it over",
                describe_holder(stale),
            )
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": _command_line(),
            "operation": operation,
            "since": time.time(),
        }
        tmp = self.directory / f".{HOLDER_FILE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, self.directory / HOLDER_FILE)


def writes(operation: str) -> Callable[[F], F]:
    """Decorate a method of an object whose ``writing(operation)`` holds its ``WriterLock`` (a
    ``GalleryStore``): the method runs inside it, as ``operation``."""

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
            with self.writing(operation):
                return method(self, *args, **kwargs)

        return locked  # type: ignore[return-value]  # functools.wraps keeps method's signature

    return decorate
