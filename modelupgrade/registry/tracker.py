"""The MLflow side of tracking: one parent run per pipeline execution, one child run per stage.

``Tracker`` opens the store (``TrackingConfig``), finds or creates the parent run of the execution
a stage belongs to (``modelupgrade.registry.execution``), and writes stages as its child runs:
live, through a ``StageRun`` (``with tracker.stage_run("report") as run: ...``), or after the fact
from a ``StageRecord`` (``track_stage``, ``write_stage``). Opening a tracker writes the records
that wait in the spool. Every write to a local SQLite store holds the store's writer lock.

MLflow is imported inside the methods: importing it costs about 1.5 s, which a stage that only
spools its record never pays.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from modelupgrade.config import Params, params_hash
from modelupgrade.errors import UserError
from modelupgrade.registry.execution import (
    PARENT_RUN_ENV,
    ExecutionParents,
    execution_key,
    is_dvc_execution_key,
)
from modelupgrade.registry.provenance import current_user, dvc_data_hash, git_commit
from modelupgrade.registry.spool import write_pending
from modelupgrade.registry.stage_log import (
    StageLog,
    StageRecord,
    metric_values,
    param_values,
    tag_values,
)
from modelupgrade.registry.tracking_config import SQLITE_PREFIX, TrackingConfig

log = logging.getLogger(__name__)

# What MLflow accepts in metric and param names (mlflow.utils.validation); the rest becomes "_".
_NOT_IN_NAMES = re.compile(r"[^/\w.\- :]")
# MLflow's limits per log_batch request (params and tags share one) and per param value
# (mlflow.utils.validation).
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1000
_PARAM_VALUE_LENGTH = 6000


class StageRun(StageLog):
    """A live child run of the pipeline's parent run; every write goes through the store's lock."""

    def __init__(self, tracker: Tracker, run_id: str) -> None:
        self.tracker = tracker
        self.run_id = run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        entries = [
            Param(_name(k), v[:_PARAM_VALUE_LENGTH]) for k, v in param_values(params).items()
        ]
        self._log_batches("params", entries, _PARAMS_PER_BATCH)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """As ``StageLog.log_metrics``; a live run also keeps a history (``step``)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [Metric(_name(k), v, now, step or 0) for k, v in metric_values(metrics).items()]
        self._log_batches("metrics", entries, _METRICS_PER_BATCH)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        entries = [RunTag(k, v) for k, v in tag_values(tags).items()]
        self._log_batches("tags", entries, _PARAMS_PER_BATCH)

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        local = Path(path)
        if not local.exists():
            raise UserError(f"cannot log artifact {local}: it does not exist")
        client = self.tracker.client
        with self.tracker.config.writer_lock():
            if local.is_dir():
                client.log_artifacts(self.run_id, str(local), artifact_path)
            else:
                client.log_artifact(self.run_id, str(local), artifact_path)

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        with self.tracker.config.writer_lock():
            self.tracker.client.log_dict(self.run_id, obj, artifact_file)

    def _log_batches(self, kind: str, entries: list[Any], per_batch: int) -> None:
        """``entries`` (params, metrics or tags) in as few requests as MLflow's limits allow."""
        if not entries:
            return
        with self.tracker.config.writer_lock():
            for start in range(0, len(entries), per_batch):
                batch = entries[start : start + per_batch]
                # kind is metrics, params or tags: the keyword mypy cannot see through **.
                self.tracker.client.log_batch(self.run_id, **{kind: batch})  # type: ignore[arg-type]


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
        if self.config.tracking_uri.startswith(SQLITE_PREFIX):
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

    def start_pipeline_run(
        self, run_name: str = "pipeline", tags: Mapping[str, str] | None = None
    ) -> str:
        """Open a parent run and export its id, so that stages started from here nest under it."""
        with self.config.writer_lock():
            run_id = self._create_parent(run_name, tags)
        os.environ[PARENT_RUN_ENV] = run_id
        return run_id

    def parent_run_id(
        self,
        execution: str | None = None,
        started_ms: int | None = None,
        tags: Mapping[str, str | None] | None = None,
    ) -> str:
        """The parent run of this pipeline execution, created by the first stage that asks.

        ``execution`` is the key of a stage that ran in another process (default: this one's); a
        parent created for a stage that started at ``started_ms`` starts then too, with ``tags``.
        ``MODELUPGRADE_PARENT_RUN_ID`` names the parent outright.
        """
        explicit = os.environ.get(PARENT_RUN_ENV)
        if explicit:
            return self._existing_run(explicit)
        key = execution or execution_key()
        with self.config.writer_lock():
            parents = ExecutionParents.load(self.config.parent_state_path, self.config.tracking_uri)
            known = parents.get(key)
            if known and self._run_exists(known):
                return known
            run_name = "dvc-repro" if is_dvc_execution_key(key) else "pipeline"
            run_id = self._create_parent(run_name, tags, started_ms)
            parents.remember(key, run_id)
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
            record.run_name,
            {"stage_kind": record.kind, **record.tags},
            record.execution,
            record.started_ms,
            {"params_hash": record.params_hash},
        )
        try:
            stage.log_params(record.params)
            stage.log_metrics(record.metrics)
            for path, artifact_path in record.artifacts:
                if Path(path).exists():
                    stage.log_artifact(path, artifact_path)
                elif record.status == "FINISHED":
                    log.warning(
                        "stage %s finished without writing %s: not logged", record.run_name, path
                    )
            for obj, artifact_file in record.documents:
                stage.log_dict(obj, artifact_file)
        except BaseException:
            self._end(stage.run_id, parent, "FAILED")
            raise
        self._end(stage.run_id, parent, record.status, record.ended_ms)
        return stage.run_id

    def write_pending_stages(self) -> int:
        """Write the stage records that wait in the spool, oldest first; returns how many."""
        return write_pending(self.config, self.write_stage)

    def _open_child(
        self,
        run_name: str,
        tags: Mapping[str, Any] | None,
        execution: str | None = None,
        started_ms: int | None = None,
        parent_tags: Mapping[str, str | None] | None = None,
    ) -> tuple[StageRun, str]:
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

        parent = self.parent_run_id(execution, started_ms, parent_tags)
        run_tags = {MLFLOW_PARENT_RUN_ID: parent, MLFLOW_RUN_NAME: run_name, "stage": run_name}
        run_tags.update(tag_values(tags or {}))
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
        self, run_name: str, tags: Mapping[str, str | None] | None, started_ms: int | None = None
    ) -> str:
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

        all_tags = {**self.pipeline_tags(), **(tags or {}), MLFLOW_RUN_NAME: run_name}
        run = self.client.create_run(
            self.experiment_id, start_time=started_ms, tags=all_tags, run_name=run_name
        )
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


def stage_wall_times(tracker: Tracker) -> dict[str, float]:
    """Seconds of the latest finished run of every stage in the tracking store (name → seconds)."""
    runs = tracker.client.search_runs(
        [tracker.experiment_id],
        filter_string="attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=5000,
    )
    seconds: dict[str, float] = {}
    for run in runs:
        stage = run.data.tags.get("stage")
        if stage and stage not in seconds and run.info.end_time:
            seconds[stage] = (run.info.end_time - run.info.start_time) / 1000.0
    return seconds


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
        # None unsets it: mlflow's code takes it, though its annotation leaves it out.
        mlflow.set_tracking_uri(before)  # type: ignore[arg-type]


def _name(key: str) -> str:
    """A metric or param name MLflow accepts: ``mAP@10`` becomes ``mAP_10``."""
    return _NOT_IN_NAMES.sub("_", key)
