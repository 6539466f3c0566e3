"""MLflow tracking for pipeline stages: one parent run per pipeline execution, one child per stage.

The embedded default is a local SQLite database (``sqlite:///mlflow.db``) with a local artifact
directory; ``MLFLOW_TRACKING_URI`` points everything at a team server instead. SQLite tolerates
one writer at a time, so every write to a local database happens under a file lock next to it:
stages run by DVC, Prefect tasks and people may log to the same store concurrently.

DVC runs each stage as its own process, so the stages of one ``dvc repro`` find their common parent
run through a small state file keyed by the ``dvc`` process that spawned them: a new ``dvc repro``
(a new process) starts a new parent. An orchestrator that is not DVC sets
``MODELUPGRADE_PARENT_RUN_ID`` (see ``Tracker.start_pipeline_run``) to group its stages.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import logging
import os
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml
from filelock import FileLock, Timeout

from modelupgrade.config import Params, RegistryParams, params_hash
from modelupgrade.errors import UserError
from modelupgrade.io import write_json

log = logging.getLogger(__name__)

PARENT_RUN_ENV = "MODELUPGRADE_PARENT_RUN_ID"
PARENT_STATE_FILE = ".parent_run.json"
_SQLITE_PREFIX = "sqlite:///"


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
        if not artifact_root.is_absolute():
            artifact_root = base / artifact_root
        return cls(
            tracking_uri=_absolute_sqlite_uri(uri, base),
            experiment=registry.experiment,
            artifact_root=artifact_root.resolve(),
            lock_timeout_s=registry.lock_timeout_s,
        )

    @property
    def sqlite_path(self) -> Path | None:
        """The database file of a local SQLite store, None for a server or another database."""
        if not self.tracking_uri.startswith(_SQLITE_PREFIX):
            return None
        path = self.tracking_uri[len(_SQLITE_PREFIX) :]
        return None if path in ("", ":memory:") else Path(path)

    @property
    def is_local(self) -> bool:
        return self.sqlite_path is not None

    def writer_lock(self) -> contextlib.AbstractContextManager[Any]:
        """Exclusive access for one writer to a local SQLite store; a server serialises itself."""
        db = self.sqlite_path
        if db is None:
            return contextlib.nullcontext()
        db.parent.mkdir(parents=True, exist_ok=True)
        return _timed_lock(db.with_name(db.name + ".lock"), self.lock_timeout_s)

    @property
    def parent_state_path(self) -> Path:
        return self.artifact_root / PARENT_STATE_FILE


@contextlib.contextmanager
def _timed_lock(path: Path, timeout_s: float) -> Iterator[None]:
    lock = FileLock(str(path), timeout=timeout_s)
    try:
        lock.acquire()
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
    if not uri.startswith(_SQLITE_PREFIX):
        scheme = urlparse(uri).scheme
        if scheme in ("", "file"):
            raise UserError(
                f"tracking URI {uri!r} is a file store, which MLflow 3 no longer supports",
                hint="use sqlite:///mlflow.db (the default) or an http(s):// tracking server",
            )
        return uri
    path = uri[len(_SQLITE_PREFIX) :]
    if path in ("", ":memory:") or path.startswith("/"):
        return uri
    return _SQLITE_PREFIX + str((base / path).resolve())


def current_user() -> str:
    for var in ("MODELUPGRADE_USER", "USER", "LOGNAME"):
        if os.environ.get(var):
            return os.environ[var]
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def git_commit(root: str | os.PathLike[str] | None = None) -> str:
    """The checked-out commit, with ``-dirty`` when tracked files differ from it."""
    cwd = str(root) if root is not None else None
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


def dvc_data_hash(lock_path: str | os.PathLike[str] = "dvc.lock", prefix: str = "data/") -> str:
    """One hash over the DVC-recorded md5s of every output under ``prefix`` in ``dvc.lock``.

    It names the data an execution ran on in DVC's own terms, so an MLflow run joins back to
    ``dvc.lock``. ``none`` when no lock file exists yet (the very first ``dvc repro``).
    """
    path = Path(lock_path)
    if not path.is_file():
        return "none"
    lock = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    entries: set[str] = set()
    for stage in (lock.get("stages") or {}).values():
        for out in stage.get("outs") or []:
            if str(out.get("path", "")).startswith(prefix):
                entries.add(f"{out['path']}:{out.get('md5', '')}")
    if not entries:
        return "none"
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()[:16]


def data_hash_of(paths: list[str | os.PathLike[str]], lock_path: str = "dvc.lock") -> str:
    """The hash of the data files a model saw: DVC's md5 when ``dvc.lock`` records them all,
    else a content hash of the files (outside DVC, e.g. in tests and Prefect flows)."""
    lock = Path(lock_path)
    wanted = [str(Path(p)) for p in paths]
    if lock.is_file():
        recorded: dict[str, str] = {}
        for stage in (yaml.safe_load(lock.read_text(encoding="utf-8")) or {}).get("stages", {}).values():
            for out in stage.get("outs") or []:
                recorded[str(Path(out.get("path", "")))] = str(out.get("md5", ""))
        if all(p in recorded for p in wanted):
            joined = "\n".join(f"{p}:{recorded[p]}" for p in sorted(wanted))
            return "dvc:" + hashlib.sha256(joined.encode()).hexdigest()[:16]
    from modelupgrade.io import tree_sha256

    existing = [p for p in paths if Path(p).exists()]
    if not existing:
        return "none"
    return "sha256:" + tree_sha256(existing)[:16]


def execution_key() -> str:
    """Identify the pipeline execution this process belongs to.

    Under DVC it is the ``dvc repro``/``dvc exp`` process that spawned us (pid and start time,
    so a recycled pid is not mistaken for the old execution); otherwise this process itself,
    which gives a standalone stage its own parent run.
    """
    pid = os.getpid()
    own = _process_identity(pid)
    while pid > 1:
        info = _proc_stat(pid)
        if info is None:
            break
        parent = info[0]
        if parent <= 1:
            break
        if _is_dvc_execution(_proc_cmdline(parent)):
            return "dvc:" + (_process_identity(parent) or str(parent))
        pid = parent
    return "process:" + (own or str(os.getpid()))


def _proc_stat(pid: int) -> tuple[int, str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = raw[raw.rfind(")") + 2 :].split()
    return int(fields[1]), fields[19]


def _process_identity(pid: int) -> str | None:
    info = _proc_stat(pid)
    return None if info is None else f"{pid}:{info[1]}"


def _proc_cmdline(pid: int) -> list[str]:
    try:
        return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0") if a]
    except OSError:
        return []


def _execution_alive(key: str) -> bool:
    """Whether the process an execution key names still runs (a recycled pid does not count)."""
    try:
        _, pid, start = key.split(":")
        info = _proc_stat(int(pid))
    except ValueError:
        return False
    if not Path("/proc").is_dir():
        return True
    return info is not None and info[1] == start


def _is_dvc_execution(argv: list[str]) -> bool:
    names = [Path(a).name for a in argv]
    if "dvc" not in names:
        return False
    return any(a in ("repro", "exp", "run") for a in argv)


class StageRun:
    """A child run of the pipeline's parent run; every write goes through the store's lock."""

    def __init__(self, tracker: Tracker, run_id: str) -> None:
        self.tracker = tracker
        self.run_id = run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        flat = _flatten(params)
        if not flat:
            return
        from mlflow.entities import Param

        with self.tracker.config.writer_lock():
            self.tracker.client.log_batch(
                self.run_id, params=[Param(k, str(v)[:6000]) for k, v in flat.items()]
            )

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        from mlflow.entities import Metric

        flat = {k: float(v) for k, v in _flatten(metrics).items() if _is_number(v)}
        if not flat:
            return
        now = int(time.time() * 1000)
        with self.tracker.config.writer_lock():
            self.tracker.client.log_batch(
                self.run_id, metrics=[Metric(k, v, now, step or 0) for k, v in flat.items()]
            )

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        if not tags:
            return
        with self.tracker.config.writer_lock():
            self.tracker.client.log_batch(
                self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()]
            )

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Log a file (report, plot, model card) or a whole directory."""
        local = Path(path)
        if not local.exists():
            raise UserError(f"cannot log artifact {local}: it does not exist")
        with self.tracker.config.writer_lock():
            if local.is_dir():
                self.tracker.client.log_artifacts(self.run_id, str(local), artifact_path)
            else:
                self.tracker.client.log_artifact(self.run_id, str(local), artifact_path)

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        with self.tracker.config.writer_lock():
            self.tracker.client.log_dict(self.run_id, obj, artifact_file)


class Tracker:
    """Entry point for stages: ``with tracker.stage_run("train", params=...) as run: ...``."""

    def __init__(self, config: TrackingConfig, params: Params | None = None) -> None:
        from mlflow import MlflowClient

        self.config = config
        self.params = params
        self.client = MlflowClient(tracking_uri=config.tracking_uri)
        # The first touch of a fresh database runs its schema migrations: one process at a time.
        with config.writer_lock():
            self.experiment_id = self._ensure_experiment()

    @classmethod
    def from_params(cls, params: Params, root: str | os.PathLike[str] | None = None) -> Tracker:
        return cls(TrackingConfig.from_params(params.registry, root), params)

    def _ensure_experiment(self) -> str:
        existing = self.client.get_experiment_by_name(self.config.experiment)
        if existing is not None:
            return existing.experiment_id
        location = None
        if self.config.is_local:
            self.config.artifact_root.mkdir(parents=True, exist_ok=True)
            location = self.config.artifact_root.as_uri()
        return self.client.create_experiment(self.config.experiment, artifact_location=location)

    def pipeline_tags(self) -> dict[str, str]:
        tags = {
            "git_commit": git_commit(),
            "dvc_data_hash": dvc_data_hash(),
            "user": current_user(),
            "modelupgrade.run_kind": "pipeline",
        }
        if self.params is not None:
            tags["params_hash"] = params_hash(self.params)
        return tags

    def start_pipeline_run(self, run_name: str = "pipeline", tags: Mapping[str, str] | None = None) -> str:
        """Open a parent run and export its id, so that stages started from here nest under it."""
        with self.config.writer_lock():
            run_id = self._create_parent(run_name, tags)
        os.environ[PARENT_RUN_ENV] = run_id
        return run_id

    def parent_run_id(self) -> str:
        """The parent run of this pipeline execution, created by the first stage that asks.

        The state file maps each live execution to its parent, so that executions running side
        by side (two flows, a person's stage beside a ``dvc repro``) keep their own parents.
        """
        explicit = os.environ.get(PARENT_RUN_ENV)
        if explicit:
            return self._existing_run(explicit)
        key = execution_key()
        state_path = self.config.parent_state_path
        with self.config.writer_lock():
            state = _read_state(state_path)
            executions = state.get("executions") if state.get("tracking_uri") == self.config.tracking_uri else None
            executions = {k: v for k, v in (executions or {}).items() if isinstance(v, str)}
            known = executions.get(key)
            if known and self._run_exists(known):
                return known
            run_id = self._create_parent("dvc-repro" if key.startswith("dvc:") else "pipeline", None)
            executions = {k: v for k, v in executions.items() if _execution_alive(k)}
            executions[key] = run_id
            write_json(
                state_path, {"tracking_uri": self.config.tracking_uri, "executions": executions}
            )
            return run_id

    @contextlib.contextmanager
    def stage_run(
        self,
        stage_name: str,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> Iterator[StageRun]:
        """A child run for one stage; FAILED when the block raises, FINISHED otherwise."""
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

        parent = self.parent_run_id()
        run_tags = {MLFLOW_PARENT_RUN_ID: parent, MLFLOW_RUN_NAME: stage_name, "stage": stage_name}
        run_tags.update({k: str(v) for k, v in (tags or {}).items()})
        with self.config.writer_lock():
            run = self.client.create_run(self.experiment_id, tags=run_tags, run_name=stage_name)
        stage = StageRun(self, run.info.run_id)
        if params:
            stage.log_params(params)
        try:
            yield stage
        except BaseException:
            self._end(stage.run_id, parent, "FAILED")
            raise
        self._end(stage.run_id, parent, "FINISHED")

    def _end(self, run_id: str, parent: str, status: str) -> None:
        # The parent ends with each stage (its status and end time are those of the latest
        # stage): no execution is left RUNNING when the pipeline stops, and a later stage of the
        # same execution still nests under it.
        with self.config.writer_lock():
            self.client.set_terminated(run_id, status=status)
            self.client.set_terminated(parent, status=status)

    def _create_parent(self, run_name: str, tags: Mapping[str, str] | None) -> str:
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

        all_tags = {**self.pipeline_tags(), **(tags or {}), MLFLOW_RUN_NAME: run_name}
        run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=run_name)
        log.info("MLflow parent run %s (%s)", run.info.run_id, run_name)
        return run.info.run_id

    def _run_exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        if not run_id:
            return False
        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            return False
        return run.info.lifecycle_stage == "active"

    def _existing_run(self, run_id: str) -> str:
        if not self._run_exists(run_id):
            raise UserError(
                f"{PARENT_RUN_ENV}={run_id} names no active run in {self.config.tracking_uri}",
                hint=f"unset {PARENT_RUN_ENV} to let the pipeline open its own parent run",
            )
        return run_id


@contextlib.contextmanager
def fluent_tracking_uri(uri: str) -> Iterator[None]:
    """Point MLflow's process-wide (fluent) API at ``uri`` for a block, then restore it.

    ``mlflow.set_tracking_uri`` also writes ``MLFLOW_TRACKING_URI`` into the environment; left
    behind, it would silently redirect every later tracker of this process to this store.
    """
    import mlflow

    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)


def _read_state(path: Path) -> dict[str, Any]:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _flatten(obj: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        elif hasattr(value, "model_dump"):
            flat.update(_flatten(value.model_dump(mode="json"), f"{name}."))
        else:
            flat[name] = value
    return flat


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
