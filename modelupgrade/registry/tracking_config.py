"""Which MLflow store runs go to, and how the processes that write to it take turns.

The embedded default is a local SQLite database (``sqlite:///mlflow.db``) with a local artifact
directory; ``MLFLOW_TRACKING_URI`` points everything at a team server instead. SQLite tolerates
one writer at a time, so every write to a local database happens under a file lock next to it:
stages run by DVC, Prefect tasks and people may log to the same store concurrently.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from filelock import FileLock, Timeout

from modelupgrade.config import RegistryParams
from modelupgrade.errors import UserError

SQLITE_PREFIX = "sqlite:///"
IN_MEMORY_URI = "sqlite:///:memory:"
PARENT_STATE_FILE = ".parent_run.json"
SPOOL_DIR = ".stage-records"


@dataclass(frozen=True)
class TrackingConfig:
    """Where runs and models go: the tracking URI, the experiment and the local artifact root."""

    tracking_uri: str
    experiment: str
    artifact_root: Path
    lock_timeout_s: float = 600.0

    @classmethod
    def from_params(
        cls, registry: RegistryParams, root: str | os.PathLike[str] | None = None
    ) -> TrackingConfig:
        base = Path(root) if root is not None else Path.cwd()
        uri = os.environ.get("MLFLOW_TRACKING_URI") or registry.tracking_uri
        artifact_root = Path(registry.artifact_root)
        if uri == IN_MEMORY_URI:
            artifact_root = _scratch_artifact_root()
        elif not artifact_root.is_absolute():
            artifact_root = base / artifact_root
        return cls(
            tracking_uri=_absolute_sqlite_uri(uri, base),
            experiment=registry.experiment,
            artifact_root=artifact_root.resolve(),
            lock_timeout_s=registry.lock_timeout_s,
        )

    def to_json(self) -> str:
        """The config as JSON, for a process that writes to the same store (the spool writer)."""
        return json.dumps({**asdict(self), "artifact_root": str(self.artifact_root)})

    @classmethod
    def from_json(cls, text: str) -> TrackingConfig:
        data = json.loads(text)
        return cls(**{**data, "artifact_root": Path(data["artifact_root"])})

    @property
    def sqlite_path(self) -> Path | None:
        """The database file of a local SQLite store, None for a server or another database."""
        if not self.tracking_uri.startswith(SQLITE_PREFIX):
            return None
        path = self.tracking_uri[len(SQLITE_PREFIX) :]
        return None if path in ("", ":memory:") else Path(path)

    @property
    def is_local(self) -> bool:
        return self.sqlite_path is not None

    @property
    def is_in_memory(self) -> bool:
        """An in-memory store lives inside the one process that opened it."""
        return self.tracking_uri == IN_MEMORY_URI

    def writer_lock(self) -> contextlib.AbstractContextManager[Any]:
        """Exclusive access for one writer to a local SQLite store; a server serialises itself."""
        db = self.sqlite_path
        if db is None:
            return contextlib.nullcontext()
        db.parent.mkdir(parents=True, exist_ok=True)
        return timed_lock(db.with_name(db.name + ".lock"), self.lock_timeout_s)

    @property
    def parent_state_path(self) -> Path:
        """The file that maps each live pipeline execution to its parent run."""
        return self.artifact_root / PARENT_STATE_FILE

    @property
    def spool_dir(self) -> Path:
        """Where stage records wait to be written: one folder per store and experiment."""
        key = hashlib.sha256(f"{self.tracking_uri}\n{self.experiment}".encode()).hexdigest()[:12]
        return self.artifact_root / SPOOL_DIR / key


@functools.cache
def _scratch_artifact_root() -> Path:
    """Artifacts of an in-memory store (the tests' store): they vanish with it, at process exit,
    instead of piling up in whatever directory the process runs in."""
    path = Path(tempfile.mkdtemp(prefix="modelupgrade-mlartifacts-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.cache
def _file_lock(path: Path) -> FileLock:
    # One lock object per file and process makes the lock reentrant: a tracker that opens while
    # its process writes the spool takes the spool's lock again without waiting for itself.
    return FileLock(str(path))


@contextlib.contextmanager
def timed_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """Hold the file lock ``path`` (reentrant within a process); a UserError after ``timeout_s``."""
    lock = _file_lock(path)
    try:
        lock.acquire(timeout=timeout_s)
    except Timeout:
        raise UserError(
            f"could not get the MLflow store lock {path} within {timeout_s:.0f} s",
            hint="another process is writing to the store; wait for it, or raise "
            "registry.lock_timeout_s, or run an MLflow server and set MLFLOW_TRACKING_URI",
        ) from None
    try:
        yield
    finally:
        lock.release()


def _absolute_sqlite_uri(uri: str, base: Path) -> str:
    """Anchor a relative SQLite path at the project root so every stage opens the same file."""
    if not uri.startswith(SQLITE_PREFIX):
        scheme = urlparse(uri).scheme
        if scheme in ("", "file"):
            raise UserError(
                f"tracking URI {uri!r} is a file store, which MLflow 3 no longer supports",
                hint="use sqlite:///mlflow.db (the default) or an http(s):// tracking server",
            )
        return uri
    path = uri[len(SQLITE_PREFIX) :]
    if path in ("", ":memory:") or path.startswith("/"):
        return uri
    return SQLITE_PREFIX + str((base / path).resolve())
