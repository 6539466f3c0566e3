"""MLflow tracking for pipeline stages: one parent run per pipeline execution, one child per stage.

The embedded default is a local SQLite database (``sqlite:///mlflow.db``) with a local artifact
directory; ``MLFLOW_TRACKING_URI`` points everything at a team server instead. SQLite tolerates
one writer at a time, so every write to a local database happens under a file lock next to it:
stages run by DVC, Prefect tasks and people may log to the same store concurrently.

DVC runs each stage as its own process, so the stages of one ``dvc repro`` find their common parent
run through a small state file keyed by the ``dvc`` process that spawned them: a new ``dvc repro``
(a new process) starts a new parent. An orchestrator that is not DVC sets
``MODELUPGRADE_PARENT_RUN_ID`` (see ``Tracker.start_pipeline_run``) to group its stages.

A stage's ``run()`` wraps its work in ``track_stage``: the work fills a ``StageRecord`` (params,
metrics, tags, artifacts) that becomes the stage's child run when the work ends. A stage process
that has not loaded MLflow (importing it costs about 1.5 s of CPU) leaves the record, with copies of
its artifacts, in a spool folder next to the artifacts and starts a writer process; every
``Tracker`` writes what waits in the spool when it opens, so that readers see every ended stage.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import getpass
import hashlib
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml
from filelock import FileLock, Timeout

from modelupgrade.config import Params, RegistryParams, params_hash
from modelupgrade.errors import UserError
from modelupgrade.io import write_json, write_text

log = logging.getLogger(__name__)

PARENT_RUN_ENV = "MODELUPGRADE_PARENT_RUN_ID"
PARENT_STATE_FILE = ".parent_run.json"
SPOOL_DIR = ".stage-records"
_SQLITE_PREFIX = "sqlite:///"
_IN_MEMORY_URI = "sqlite:///:memory:"
# What MLflow accepts in metric and param names (mlflow.utils.validation); anything else becomes "_".
_NOT_IN_NAMES = re.compile(r"[^/\w.\- :]")
# MLflow's limits per log_batch request (mlflow.utils.validation).
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1000


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
        if uri == _IN_MEMORY_URI:
            artifact_root = _scratch_artifact_root()
        elif not artifact_root.is_absolute():
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
def _timed_lock(path: Path, timeout_s: float) -> Iterator[None]:
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


@functools.lru_cache(maxsize=4)
def _locked_outputs(lock_path: Path, mtime_ns: int, size: int) -> dict[str, str]:
    """``{output path: md5}`` of every stage in ``dvc.lock``, parsed once per version of the file.

    dvc.lock grows to hundreds of kilobytes; libyaml's C loader parses it in a fraction of the pure
    Python loader's time, which every stage would otherwise pay several times.
    """
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    lock = yaml.load(lock_path.read_text(encoding="utf-8"), Loader=loader) or {}
    return {
        str(Path(out.get("path", ""))): str(out.get("md5", ""))
        for stage in (lock.get("stages") or {}).values()
        for out in stage.get("outs") or []
    }


def locked_outputs(lock_path: str | os.PathLike[str] = "dvc.lock") -> dict[str, str] | None:
    """The outputs recorded in ``dvc.lock`` with their md5, or None when there is no lock file."""
    path = Path(lock_path).resolve()
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return _locked_outputs(path, stat.st_mtime_ns, stat.st_size)


def dvc_data_hash(lock_path: str | os.PathLike[str] = "dvc.lock", prefix: str = "data/") -> str:
    """One hash over the DVC-recorded md5s of every output under ``prefix`` in ``dvc.lock``.

    It names the data an execution ran on in DVC's own terms, so an MLflow run joins back to
    ``dvc.lock``. ``none`` when no lock file exists yet (the very first ``dvc repro``).
    """
    recorded = locked_outputs(lock_path) or {}
    entries = {f"{path}:{md5}" for path, md5 in recorded.items() if path.startswith(prefix)}
    if not entries:
        return "none"
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()[:16]


def data_hash_of(paths: list[str | os.PathLike[str]], lock_path: str = "dvc.lock") -> str:
    """The hash of the data files a model saw: DVC's md5 when ``dvc.lock`` records them all,
    else a content hash of the files (outside DVC, e.g. in tests and Prefect flows)."""
    wanted = [str(Path(p)) for p in paths]
    recorded = locked_outputs(lock_path)
    if recorded is not None and all(p in recorded for p in wanted):
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
        from mlflow.entities import Param

        entries = [Param(_name(k), str(v)[:6000]) for k, v in _flatten(params).items()]
        with self.tracker.config.writer_lock():
            for start in range(0, len(entries), _PARAMS_PER_BATCH):
                self.tracker.client.log_batch(self.run_id, params=entries[start : start + _PARAMS_PER_BATCH])

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [
            Metric(_name(k), float(v), now, step or 0) for k, v in _flatten(metrics).items() if _is_number(v)
        ]
        with self.tracker.config.writer_lock():
            for start in range(0, len(entries), _METRICS_PER_BATCH):
                self.tracker.client.log_batch(self.run_id, metrics=entries[start : start + _METRICS_PER_BATCH])

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
        self.write_pending_stages()

    @classmethod
    def from_params(cls, params: Params, root: str | os.PathLike[str] | None = None) -> Tracker:
        return cls(TrackingConfig.from_params(params.registry, root), params)

    def _ensure_experiment(self) -> str:
        existing = self.client.get_experiment_by_name(self.config.experiment)
        if existing is not None:
            return existing.experiment_id
        location = None
        if self.config.tracking_uri.startswith(_SQLITE_PREFIX):
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

    def parent_run_id(
        self, execution: str | None = None, started_ms: int | None = None, tags: Mapping[str, str] | None = None
    ) -> str:
        """The parent run of this pipeline execution, created by the first stage that asks.

        The state file maps each live execution to its parent, so that executions running side
        by side (two flows, a person's stage beside a ``dvc repro``) keep their own parents.
        ``execution`` is the key of a stage that ran in another process (default: this one's); a
        parent created for a stage that started at ``started_ms`` starts then too, with ``tags``.
        """
        explicit = os.environ.get(PARENT_RUN_ENV)
        if explicit:
            return self._existing_run(explicit)
        key = execution or execution_key()
        state_path = self.config.parent_state_path
        with self.config.writer_lock():
            state = _read_state(state_path)
            executions = state.get("executions") if state.get("tracking_uri") == self.config.tracking_uri else None
            executions = {k: v for k, v in (executions or {}).items() if isinstance(v, str)}
            known = executions.get(key)
            if known and self._run_exists(known):
                return known
            run_id = self._create_parent("dvc-repro" if key.startswith("dvc:") else "pipeline", tags, started_ms)
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
        stage, parent = self._open_child(stage_name, tags)
        if params:
            stage.log_params(params)
        try:
            yield stage
        except BaseException:
            self._end(stage.run_id, parent, "FAILED")
            raise
        self._end(stage.run_id, parent, "FINISHED")

    def write_stage(self, record: StageRecord) -> str:
        """Write a stage that has ended as a child run of its execution's parent; returns its id.

        Artifacts that do not exist are left out (a failed stage may not have written them all).
        """
        stage, parent = self._open_child(
            record.run_name, {"stage_kind": record.kind, **record.tags}, record.execution, record.started_ms,
            {"params_hash": record.params_hash},
        )
        try:
            stage.log_params(record.params)
            stage.log_metrics(record.metrics)
            for path, artifact_path in record.artifacts:
                if Path(path).exists():
                    stage.log_artifact(path, artifact_path)
                elif record.status == "FINISHED":
                    log.warning("stage %s finished without writing %s: not logged", record.run_name, path)
        except BaseException:
            self._end(stage.run_id, parent, "FAILED")
            raise
        self._end(stage.run_id, parent, record.status, record.ended_ms)
        return stage.run_id

    def write_pending_stages(self) -> int:
        """Write the stage records that wait in the spool, oldest first; returns how many."""
        spool = self.config.spool_dir
        if not _pending_records(spool):
            return 0
        written = 0
        with _timed_lock(spool / ".write.lock", self.config.lock_timeout_s):
            while pending := _pending_records(spool):
                for path in pending:
                    try:
                        record = StageRecord.from_json(path.read_text(encoding="utf-8"))
                    except (ValueError, TypeError, KeyError) as err:
                        log.warning("stage record %s is not readable (%s): set aside", path, err)
                        path.rename(path.with_suffix(".unreadable"))
                        continue
                    self.write_stage(record)
                    path.unlink()
                    shutil.rmtree(path.with_suffix(""), ignore_errors=True)
                    written += 1
        return written

    def _open_child(
        self,
        run_name: str,
        tags: Mapping[str, Any] | None,
        execution: str | None = None,
        started_ms: int | None = None,
        parent_tags: Mapping[str, str] | None = None,
    ) -> tuple[StageRun, str]:
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

        parent = self.parent_run_id(execution, started_ms, parent_tags)
        run_tags = {MLFLOW_PARENT_RUN_ID: parent, MLFLOW_RUN_NAME: run_name, "stage": run_name}
        run_tags.update({k: str(v) for k, v in (tags or {}).items()})
        with self.config.writer_lock():
            run = self.client.create_run(
                self.experiment_id, start_time=started_ms, tags=run_tags, run_name=run_name
            )
        return StageRun(self, run.info.run_id), parent

    def _end(self, run_id: str, parent: str, status: str, ended_ms: int | None = None) -> None:
        # The parent ends with each stage (its status and end time are those of the latest
        # stage): no execution is left RUNNING when the pipeline stops, and a later stage of the
        # same execution still nests under it.
        with self.config.writer_lock():
            self.client.set_terminated(run_id, status=status, end_time=ended_ms)
            self.client.set_terminated(parent, status=status, end_time=ended_ms)

    def _create_parent(
        self, run_name: str, tags: Mapping[str, str] | None, started_ms: int | None = None
    ) -> str:
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

        all_tags = {**self.pipeline_tags(), **(tags or {}), MLFLOW_RUN_NAME: run_name}
        run = self.client.create_run(self.experiment_id, start_time=started_ms, tags=all_tags, run_name=run_name)
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


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class StageRecord:
    """What one stage reports to MLflow, collected while it works and written when it ends.

    It offers the logging methods of ``StageRun``, but nothing reaches the store before the stage
    ends: the work never waits for MLflow, and a record can wait in the spool as JSON.
    """

    kind: str  # the stage's name (train, evaluate, ...); ``run_name`` also says what it worked on
    run_name: str
    execution: str
    params_hash: str | None = None  # tags the pipeline's parent run when this record creates it
    started_ms: int = field(default_factory=_now_ms)
    ended_ms: int | None = None
    status: str = "RUNNING"
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: list[tuple[str, str | None]] = field(default_factory=list)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.params.update({k: str(v) for k, v in _flatten(params).items() if v is not None})

    def log_metrics(self, metrics: Mapping[str, Any]) -> None:
        """Numbers only; a NaN or infinite value (a metric that does not apply) is left out."""
        self.metrics.update(
            {k: float(v) for k, v in _flatten(metrics).items() if _is_number(v) and math.isfinite(float(v))}
        )

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self.tags.update({k: str(v) for k, v in tags.items()})

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """A file or directory to log when the stage ends (it may not exist yet)."""
        self.artifacts.append((str(Path(path).resolve()), artifact_path))

    def log_artifacts(self, paths: Iterable[str | os.PathLike[str]], artifact_path: str | None = None) -> None:
        for path in paths:
            self.log_artifact(path, artifact_path)

    def end(self, status: str, error: BaseException | None = None) -> None:
        self.status = status
        self.ended_ms = _now_ms()
        if error is not None:
            self.tags["error"] = f"{type(error).__name__}: {error}"[:5000]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> StageRecord:
        data = json.loads(text)
        data["artifacts"] = [tuple(entry) for entry in data["artifacts"]]
        return cls(**data)


def spool_record(record: StageRecord, config: TrackingConfig) -> Path:
    """Leave ``record`` in the spool with copies of its artifacts (later stages or a re-run may
    change the originals before the record is written); returns the record's file."""
    spool = config.spool_dir
    name = f"{record.started_ms}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    copies = spool / name
    artifacts: list[tuple[str, str | None]] = []
    for index, (path, folder) in enumerate(record.artifacts):
        source = Path(path)
        if source.exists():
            target = copies / str(index) / source.name
            target.parent.mkdir(parents=True)
            (shutil.copytree if source.is_dir() else shutil.copyfile)(source, target)
            path = str(target)
        artifacts.append((path, folder))
    spooled = spool / f"{name}.json"
    write_text(spooled, replace(record, artifacts=artifacts).to_json())
    return spooled


def _start_spool_writer(config: TrackingConfig) -> subprocess.Popen[bytes]:
    """A process that writes the spool and ends: it outlives the stage, which does not wait."""
    import modelupgrade

    package_root = str(Path(modelupgrade.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    # The writer talks to the project's store only; MLflow's usage telemetry is not its business.
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    setup = json.dumps({**asdict(config), "artifact_root": str(config.artifact_root)})
    with open(config.spool_dir / "writer.log", "ab") as log_file:
        # A session of its own: a Ctrl-C that stops the pipeline does not cut a write short.
        return subprocess.Popen(
            [sys.executable, "-c", "from modelupgrade.registry.tracking import write_spool; write_spool()", setup],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, env=env, start_new_session=True,
        )


def write_spool() -> None:
    """Entry point of the spool writer (argument: the ``TrackingConfig`` as JSON).

    It takes the spool's lock before it loads MLflow: a writer that finds the spool emptied by the
    one before it ends without paying for the import.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    setup = json.loads(sys.argv[1])
    config = TrackingConfig(**{**setup, "artifact_root": Path(setup["artifact_root"])})
    with _timed_lock(config.spool_dir / ".write.lock", config.lock_timeout_s):
        if _pending_records(config.spool_dir):
            Tracker(config)  # opening a tracker writes what waits in the spool
            log.info("wrote the waiting stage runs to %s", config.tracking_uri)


def _pending_records(spool: Path) -> list[Path]:
    return sorted(spool.glob("*.json")) if spool.is_dir() else []


@contextlib.contextmanager
def track_stage(
    stage: str,
    params: Params,
    *,
    run_name: str | None = None,
    arguments: Mapping[str, Any] | None = None,
) -> Iterator[StageRecord]:
    """Log the stage that runs in the block as one child run of its pipeline execution.

    The block fills the record it gets (params sections, headline metrics, report artifacts);
    ``arguments`` (what the stage was asked to do) become params ``args.*``. When the block ends the
    record is written, FAILED (with an ``error`` tag) if the block raised, and the exception goes on.
    Tracking writes nothing into the stage's outputs and never fails a stage: a record that cannot
    be written now waits in the spool for the next tracker.
    """
    config = TrackingConfig.from_params(params.registry)
    record = StageRecord(stage, run_name or stage, execution_key(), params_hash=params_hash(params))
    if arguments is not None:
        record.log_params({"args": arguments})
    try:
        yield record
    except BaseException as err:
        record.end("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED", err)
        _write(record, config, params)
        raise
    record.end("FINISHED")
    _write(record, config, params)


def _write(record: StageRecord, config: TrackingConfig, params: Params) -> None:
    """Write now where MLflow is loaded (tens of milliseconds), else spool for a writer process.

    An in-memory store lives inside one process: one this process has not opened (MLflow not
    loaded) can be read by no one, so the record is dropped rather than spend seconds on importing
    MLflow and creating the store's schema (the tests' default store, and stages they spawn).
    """
    if int(os.environ.get("RANK", "0")) != 0:
        return  # under torchrun every process runs the stage; rank 0 alone records it
    if "mlflow" in sys.modules:
        try:
            Tracker(config, params).write_stage(record)
            return
        except Exception as err:  # noqa: BLE001 - the stage's outputs stand; the record waits
            log.warning("could not log stage %s to MLflow now (%s): it waits in %s", record.run_name, err,
                        config.spool_dir)
    elif config.tracking_uri == _IN_MEMORY_URI:
        return
    try:
        spool_record(record, config)
        _start_spool_writer(config)
    except OSError as err:
        log.warning("could not leave stage %s for MLflow in %s: %s", record.run_name, config.spool_dir, err)


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


def _name(key: str) -> str:
    """A metric or param name MLflow accepts: ``mAP@10`` becomes ``mAP_10``."""
    return _NOT_IN_NAMES.sub("_", key)
