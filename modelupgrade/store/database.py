"""The store's SQLite database: one connection, its lock, transactions and the meta table.

SQLite runs in WAL mode: readers see the last committed state while a writer works, and a writer
killed mid-transaction leaves the previous state intact. Every write bumps a commit counter, which
lets a reader reuse what it read until the store changes.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeGuard

from modelupgrade.errors import UserError
from modelupgrade.store.faults import damaged
from modelupgrade.store.schema import (
    DATABASE_FILE,
    DDL,
    MIGRATIONS,
    SCHEMA_VERSION,
    VECTORS_DIR,
)


class Database:
    """An open store database. Thread-safe: one connection behind a re-entrant lock."""

    def __init__(
        self, path: Path, connection: sqlite3.Connection, identity: tuple[int, int] = (0, 0)
    ) -> None:
        self.path = path
        self.connection = connection
        self.lock = threading.RLock()
        # The database file this connection reads (device, inode): a store directory replaced
        # under an open store (restored from a backup, say) is another store.
        self.identity = identity
        # Run inside every write transaction before it commits (the store records there what its
        # readers must wait for: ``GalleryStore``).
        self.on_commit: Callable[[sqlite3.Connection], None] | None = None
        # Run after every write transaction has committed (the store publishes its serving state).
        self.after_commit: Callable[[], None] | None = None

    def still_backs_the_store(self) -> bool:
        """Whether the file this connection reads is still the store's database at its path."""
        try:
            found = os.stat(self.path / DATABASE_FILE)
        except OSError:
            return False
        return (found.st_dev, found.st_ino) == self.identity

    @classmethod
    def create(cls, path: Path, meta: dict[str, str] | None = None) -> None:
        """Lay out a new, empty store in the directory ``path`` (the caller holds its commit lock,
        so no other process creates one there meanwhile), its ``meta`` recorded from the start. The
        database is built beside and renamed into place whole: a store directory either has a
        complete, empty database or none."""
        if (path / DATABASE_FILE).exists():
            raise UserError(
                f"a gallery store already exists at {path}",
                hint="open it, or choose another directory",
            )
        (path / VECTORS_DIR).mkdir(parents=True, exist_ok=True)
        tmp_db = path / f".{DATABASE_FILE}.tmp"
        tmp_db.unlink(missing_ok=True)
        connection = sqlite3.connect(tmp_db)
        try:
            connection.executescript(DDL)
            connection.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [
                    ("schema_version", str(SCHEMA_VERSION)),
                    ("commit_counter", "0"),
                    ("items_epoch", "0"),
                    ("created_at", repr(time.time())),
                    ("store_id", uuid.uuid4().hex),
                    ("next_slot", "0"),
                    ("next_backfill", "1"),
                    ("next_storage", "1"),
                    *(meta or {}).items(),
                ],
            )
            connection.commit()
        except sqlite3.DatabaseError as err:
            raise damaged(path, err) from None
        finally:
            connection.close()
        with open(tmp_db, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_db, path / DATABASE_FILE)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename is durable: the directory entry is on disk
        finally:
            os.close(fd)

    @classmethod
    def open(cls, path: Path) -> Database:
        database = path / DATABASE_FILE
        if not database.is_file():
            raise UserError(
                f"no gallery store at {path} ({DATABASE_FILE} is missing)",
                hint="create one with `modelupgrade store-ingest`",
            )
        identity = os.stat(database)
        connection = sqlite3.connect(
            database, timeout=60.0, isolation_level=None, check_same_thread=False
        )
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
            connection.execute("PRAGMA foreign_keys=ON")
            connection.execute("PRAGMA busy_timeout=60000")
            row = connection.execute(
                "SELECT value FROM meta WHERE key = 'schema_version'"
            ).fetchone()
        except sqlite3.DatabaseError as err:
            connection.close()
            raise damaged(path, err) from None
        found = None if row is None else row[0]
        if found is not None and found.isdigit() and int(found) in MIGRATIONS:
            try:
                found = cls._migrate(connection, int(found))
            except sqlite3.DatabaseError as err:
                connection.close()
                raise UserError(
                    f"cannot bring gallery store {path} from schema version {found} to "
                    f"{SCHEMA_VERSION}: {err}",
                    hint="the migration changed nothing; open the store where its database is "
                    "writable (once), or rebuild it",
                ) from None
        if found != str(SCHEMA_VERSION):
            connection.close()
            raise UserError(
                f"gallery store {path} has schema version {found}, this modelupgrade reads "
                f"version {SCHEMA_VERSION}",
                hint="rebuild the store with this version (`modelupgrade store-ingest`), or use "
                "the modelupgrade release that wrote it",
            )
        return cls(path, connection, (identity.st_dev, identity.st_ino))

    @staticmethod
    def _migrate(connection: sqlite3.Connection, version: int) -> str:
        """Bring a store of schema ``version`` to ``SCHEMA_VERSION``, all steps in one transaction
        (a store is never left half-migrated); returns the version reached."""
        connection.execute("BEGIN IMMEDIATE")
        try:
            # Read again inside the transaction: another process may have migrated it meanwhile.
            version = int(Database.meta(connection, "schema_version") or version)
            while version in MIGRATIONS:
                step = MIGRATIONS[version]
                if callable(step):
                    step(connection)
                else:
                    # One statement at a time: executescript would commit the open transaction.
                    for statement in step.split(";"):
                        if statement.strip():
                            connection.execute(statement)
                version += 1
                Database.set_meta(connection, "schema_version", str(version))
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
        return str(version)

    def close(self) -> None:
        with self.lock:
            self.connection.close()

    @contextmanager
    def write(self, items_changed: bool = False) -> Iterator[sqlite3.Connection]:
        """One write transaction; it bumps the commit counter, and the items epoch when it changes
        item rows (what lets a reader keep the item table it read while only chunks commit)."""
        last = "UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'commit_counter'"
        if items_changed:
            last += "; UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'items_epoch'"
        with self._transaction("BEGIN IMMEDIATE", last) as connection:
            yield connection
            if self.on_commit is not None:
                self.on_commit(connection)
        if self.after_commit is not None:
            self.after_commit()

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: every query in it sees the same committed state."""
        with self._transaction("BEGIN") as connection:
            yield connection

    @contextmanager
    def _transaction(
        self, begin: str, last_statements: str | None = None
    ) -> Iterator[sqlite3.Connection]:
        """A transaction opened with ``begin`` that commits, after ``last_statements``, only if
        its block ends normally. An SQLite failure (a damaged page, a full disk) is one error line
        (``faults.damaged``), the transaction rolled back."""
        with self.lock:
            try:
                self.connection.execute(begin)
            except sqlite3.DatabaseError as err:
                raise damaged(self.path, err) from None
            try:
                yield self.connection
                for statement in (last_statements or "").split(";"):
                    if statement.strip():
                        self.connection.execute(statement)
                self.connection.execute("COMMIT")
            except BaseException as failure:
                if self.connection.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self.connection.execute("ROLLBACK")
                if _is_damage(failure):
                    raise damaged(self.path, failure) from None
                raise

    def query(self, sql: str, arguments: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """A single read statement's rows (one implicit transaction)."""
        with self.lock:
            try:
                return self.connection.execute(sql, arguments).fetchall()
            except sqlite3.DatabaseError as err:
                if not _is_damage(err):
                    raise
                raise damaged(self.path, err) from None

    @staticmethod
    def meta(db: sqlite3.Connection, key: str) -> str | None:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    @staticmethod
    def set_meta(db: sqlite3.Connection, key: str, value: str) -> None:
        db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET "
            "value = excluded.value",
            (key, value),
        )

    def commit_counter(self) -> int:
        return int(self.query("SELECT value FROM meta WHERE key = 'commit_counter'")[0][0])

    @staticmethod
    def take_counter(db: sqlite3.Connection, key: str, count: int = 1) -> int:
        """The next value of counter ``key`` (``schema.COUNTERS``), ``count`` of them taken
        inside the caller's write transaction: a value is never handed out twice."""
        first = int(Database.meta(db, key) or 0)
        Database.set_meta(db, key, str(first + count))
        return first


def _is_damage(err: BaseException) -> TypeGuard[sqlite3.DatabaseError]:
    """An SQLite failure of the database itself (damage, a full disk, a lock held too long), not
    a statement's own (a constraint, a misuse: a bug to see with its traceback)."""
    return isinstance(err, sqlite3.DatabaseError) and not isinstance(
        err, (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError)
    )
