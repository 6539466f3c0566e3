"""Who may write a store: two cross-process locks that writers hold and no reader takes.

* The *writer lease* (``writer.lock``, its holder in ``writer.json``): one backfill at a time, held
  for its whole run, and by the steps that must not meet a running backfill (abort, cutover,
  rollback, cleanup). A second one is refused at once, naming the holder.
* The *commit lock* (``commit.lock`` / ``commit.json``): one write step at a time (a backfill's
  group commit, an ingest, an update, an erasure, a serving step's transaction). A writer waits
  for it a while (``COMMIT_WAIT_S``), so live writes go on during a backfill, between its commits.

Each is an exclusive ``flock`` and a record of who holds it (pid, host, command line, operation,
since when), so a refused writer's error names the holder. The kernel releases a ``flock`` when its
holder dies, SIGKILL included, so a stale lock cannot block anyone: the next writer gets the lock,
finds the dead holder's record and replaces it. Readers (search, status, the HTTP service) open
the store without touching any of these files, so a reader needs no write access to the store.

A lock is re-entrant per ``WriterLock`` object (one per open ``GalleryStore``), so a backfill
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from modelupgrade.errors import UserError

log = logging.getLogger(__name__)

LOCK_FILE = "writer.lock"
HOLDER_FILE = "writer.json"
COMMIT_LOCK_FILE = "commit.lock"
COMMIT_HOLDER_FILE = "commit.json"
# How long a write step waits for another one's commit lock before it is refused, naming it.
COMMIT_WAIT_S = 120.0
_POLL_S = 0.02
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


@dataclass(frozen=True)
class LockHolder:
    """Who took a lock: its record in the holder file (``writer.json`` or ``commit.json``)."""

    pid: int
    host: str
    command: str
    operation: str
    since: float  # seconds since the epoch

    @classmethod
    def read(cls, path: Path) -> LockHolder | None:
        """The record at ``path``; None when there is none, or it is unreadable or half-written
        (its writer died before the rename, or it predates a field)."""
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                pid=int(raw["pid"]),
                host=str(raw["host"]),
                command=str(raw["command"]),
                operation=str(raw["operation"]),
                since=float(raw["since"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, path: Path) -> None:
        """Write the record whole (a reader finds the old one or this one, never a torn one)."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(self)), encoding="utf-8")
        os.replace(tmp, path)

    @property
    def on_this_host(self) -> bool:
        return self.host == socket.gethostname()


def describe_holder(holder: LockHolder | None) -> str:
    """A holder as a person reads it: pid, host, command, operation, since when."""
    if holder is None:
        return "another process (it has not recorded itself yet)"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder.since))
    where = "" if holder.on_this_host else f" on host {holder.host}"
    return (
        f"pid {holder.pid}{where} ({holder.operation}: `{holder.command}`), since {stamp} "
        f"({time.time() - holder.since:.0f} s ago)"
    )


class WriterLock:
    """A lock of the store in ``directory`` (the writer lease by default, or the commit lock:
    ``lock_file``, ``holder_file``); nothing is created until it is taken."""

    def __init__(
        self, directory: Path, lock_file: str = LOCK_FILE, holder_file: str = HOLDER_FILE
    ) -> None:
        self.directory = Path(directory)
        self.lock_file, self.holder_file = lock_file, holder_file
        self._fd: int | None = None
        self._depth = 0
        self._mutex = threading.Lock()
        # Whether the last acquisition found the record of a holder that never let go (it died):
        # what it was doing may be half-done.
        self.took_over = False
        # What the holder record says this process runs (default: its command line).
        self.command: str | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> LockHolder | None:
        """The record of the last writer that took the lock (None if there is none)."""
        return LockHolder.read(self.directory / self.holder_file)

    @contextlib.contextmanager
    def hold(self, operation: str, wait: float = 0.0) -> Iterator[None]:
        """Hold the lock for the block; another holder's makes this raise a ``UserError`` (after
        ``wait`` seconds of trying)."""
        self.acquire(operation, wait)
        try:
            yield
        finally:
            self.release()

    def acquire(self, operation: str, wait: float = 0.0) -> None:
        with self._mutex:
            if self._fd is not None:
                self._depth += 1
                return
            try:
                fd = os.open(
                    self.directory / self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
                )
            except OSError as err:
                raise UserError(
                    f"cannot {operation}: the store at {self.directory} cannot be written "
                    f"({os.strerror(err.errno or 0)})",
                    hint="writers need write access to the store directory; readers do not",
                ) from None
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as err:
                    if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        os.close(fd)
                        raise
                    if time.monotonic() >= deadline:
                        os.close(fd)
                        raise self._busy(operation, wait) from None
                    time.sleep(_POLL_S)
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
            (self.directory / self.holder_file).unlink(missing_ok=True)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def _busy(self, operation: str, waited: float = 0.0) -> UserError:
        record = self.holder()
        holder = describe_holder(record)
        if record is not None and record.on_this_host and not pid_alive(record.pid):
            # A child that inherited the lock outlives the process that took it.
            holder += "; that pid has exited, a process it started still holds the lock"
        stop = (
            f"stop it (`kill -TERM {record.pid}`: a backfill stops at a chunk boundary and "
            "resumes when run again)"
            if record is not None
            else "stop it"
        )
        after = f" (waited {waited:.0f} s)" if waited else ""
        return UserError(
            f"cannot {operation}: the store at {self.directory} is being written by {holder}"
            + after,
            hint=f"one writer at a time: wait for it to finish or {stop}; search, serve and "
            "store-status are not blocked",
        )

    def _take_over(self, operation: str) -> None:
        stale = self.holder()
        self.took_over = stale is not None
        if stale is not None:
            log.warning(
                "the store's writer lock was left by %s, which ended without releasing it; "
                "taking it over",
                describe_holder(stale),
            )
        LockHolder(
            pid=os.getpid(),
            host=socket.gethostname(),
            command=self.command or _command_line(),
            operation=operation,
            since=time.time(),
        ).write(self.directory / self.holder_file)


def writes(operation: str) -> Callable[[F], F]:
    """Decorate a method of an object whose ``committing(operation)`` holds its commit lock (a
    ``GalleryStore``): the method runs inside it, as ``operation``."""

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
            with self.committing(operation):
                return method(self, *args, **kwargs)

        return locked  # type: ignore[return-value]  # functools.wraps keeps method's signature

    return decorate
