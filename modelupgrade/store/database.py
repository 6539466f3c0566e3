"""The store's SQLite database: one connection, its lock, transactions and the meta table.

SQLite runs in WAL mode: readers see the last committed state while a writer works, and a writer
killed mid-transaction leaves the previous state intact. Every write bumps a commit counter, which
lets a reader reuse what it read until the store changes.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from modelupgrade.errors import UserError
from modelupgrade.store.schema import (
    DATABASE_FILE,
    DDL,
    MIGRATIONS,
    SCHEMA_VERSION,
    VECTORS_DIR,
)


class Database:
    """An open store database. Thread-safe: one connection behind a re-entrant lock."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self.connection = connection
        self.lock = threading.RLock()

    @classmethod
    def create(cls, path: Path) -> None:
        """Lay out a new, empty store directory (the database is renamed into place whole)."""
        if (path / DATABASE_FILE).exists():
            raise UserError(
                f"a gallery store already exists at {path}",
                hint="open it, or choose another directory",
            )
        if path.exists() and any(path.iterdir()):
            raise UserError(
                f"{path} exists and is not empty",
                hint="a new store needs an empty or absent directory",
            )
        (path / VECTORS_DIR).mkdir(parents=True, exist_ok=True)
        tmp_db = path / f".{DATABASE_FILE}.tmp"
        tmp_db.unlink(missing_ok=True)
        connection = sqlite3.connect(tmp_db)
        connection.executescript(DDL)
        connection.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?)",
            [
                ("schema_version", str(SCHEMA_VERSION)),
                ("commit_counter", "0"),
                ("created_at", repr(time.time())),
            ],
        )
        connection.commit()
        connection.close()
        os.replace(tmp_db, path / DATABASE_FILE)

    @classmethod
    def open(cls, path: Path) -> Database:
        database = path / DATABASE_FILE
        if not database.is_file():
            raise UserError(
                f"no gallery store at {path} ({DATABASE_FILE} is missing)",
                hint="create one with `modelupgrade store-ingest`",
            )
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
            raise UserError(f"{database} is not a readable gallery store: {err}") from None
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
        return cls(path, connection)

    @staticmethod
    def _migrate(connection: sqlite3.Connection, version: int) -> str:
        """Bring a store of schema ``version`` to ``SCHEMA_VERSION``, all steps in one transaction
        (a store is never left half-migrated); returns the version reached."""
        connection.execute("BEGIN IMMEDIATE")
        try:
            # Read again inside the transaction: another process may have migrated it meanwhile.
            version = int(Database.meta(connection, "schema_version") or version)
            while version in MIGRATIONS:
                # One statement at a time: executescript would commit the open transaction.
                for statement in MIGRATIONS[version].split(";"):
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
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; it bumps the commit counter."""
        with self._transaction(
            "BEGIN IMMEDIATE",
            "UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'commit_counter'",
        ) as connection:
            yield connection

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: every query in it sees the same committed state."""
        with self._transaction("BEGIN") as connection:
            yield connection

    @contextmanager
    def _transaction(
        self, begin: str, last_statement: str | None = None
    ) -> Iterator[sqlite3.Connection]:
        """A transaction opened with ``begin`` that commits, after ``last_statement``, only if its
        block ends normally."""
        with self.lock:
            self.connection.execute(begin)
            try:
                yield self.connection
                if last_statement is not None:
                    self.connection.execute(last_statement)
            except BaseException:
                self.connection.execute("ROLLBACK")
                raise
            self.connection.execute("COMMIT")

    def query(self, sql: str, arguments: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """A single read statement's rows (one implicit transaction)."""
        with self.lock:
            return self.connection.execute(sql, arguments).fetchall()

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
        with self.lock:
            return int(self.meta(self.connection, "commit_counter") or 0)
