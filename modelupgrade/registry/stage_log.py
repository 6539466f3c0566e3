"""What one pipeline stage logs to MLflow, and the one interface it logs it through.

A stage logs params (nested sections are flattened to ``section.key``), metrics (finite numbers),
tags and artifacts (files, directories, small documents). ``StageLog`` is that interface; it has
two implementations, so a stage's code is the same whichever way its run reaches the store:

- ``StageRun`` (``modelupgrade.registry.tracker``) writes each call to a live MLflow run at once;
- ``StageRecord`` (here) collects the calls while the stage works and becomes a run when the
  stage ends, so the work never waits for MLflow and the record can wait on disk as JSON.

Both keep the same values: a param that is None and a metric that is not a finite number (a
metric that does not apply) are left out.
"""

from __future__ import annotations

import json
import math
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


class StageLog(ABC):
    """Params, metrics, tags and artifacts of one stage's run."""

    @abstractmethod
    def log_params(self, params: Mapping[str, Any]) -> None:
        """Params, nested mappings and pydantic models flattened to ``section.key``."""

    @abstractmethod
    def log_metrics(self, metrics: Mapping[str, Any]) -> None:
        """Numbers only, nested like params; a NaN or infinite value is left out."""

    @abstractmethod
    def set_tags(self, tags: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """A file or a whole directory, under ``artifact_path`` in the run's artifacts."""

    @abstractmethod
    def log_dict(self, obj: Any, artifact_file: str) -> None:
        """A small JSON or YAML document (by ``artifact_file``'s suffix) as an artifact."""

    def log_artifacts(
        self, paths: Iterable[str | os.PathLike[str]], artifact_path: str | None = None
    ) -> None:
        for path in paths:
            self.log_artifact(path, artifact_path)


def param_values(params: Mapping[str, Any]) -> dict[str, str]:
    """What ``log_params`` keeps: flattened names, values as text, None left out."""
    return {k: str(v) for k, v in _flatten(params).items() if v is not None}


def metric_values(metrics: Mapping[str, Any]) -> dict[str, float]:
    """What ``log_metrics`` keeps: flattened names, finite numbers only."""
    return {
        k: float(v)
        for k, v in _flatten(metrics).items()
        if _is_number(v) and math.isfinite(float(v))
    }


def tag_values(tags: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in tags.items()}


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class StageRecord(StageLog):
    """A stage's run, collected while it works and written to MLflow when it ends.

    Nothing reaches the store before the stage ends; artifacts are read then (a path logged here
    may not exist yet). A record keeps one value per metric, the last one logged.
    """

    kind: str  # the stage's name (train, evaluate, ...); ``run_name`` also says what it worked on
    run_name: str
    execution: str
    params_hash: str | None = None  # tags the pipeline's parent run when this record creates it
    started_ms: int = field(default_factory=now_ms)
    ended_ms: int | None = None
    status: str = "RUNNING"
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: list[tuple[str, str | None]] = field(default_factory=list)
    documents: list[tuple[Any, str]] = field(default_factory=list)  # (object, artifact file)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.params.update(param_values(params))

    def log_metrics(self, metrics: Mapping[str, Any]) -> None:
        self.metrics.update(metric_values(metrics))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self.tags.update(tag_values(tags))

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        self.artifacts.append((str(Path(path).resolve()), artifact_path))

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        # Serialised now: the record may wait on disk, and later changes to ``obj`` are not the
        # stage's report.
        self.documents.append((json.loads(json.dumps(obj)), artifact_file))

    def end(self, status: str, error: BaseException | None = None) -> None:
        self.status = status
        self.ended_ms = now_ms()
        if error is not None:
            self.tags["error"] = f"{type(error).__name__}: {error}"[:5000]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> StageRecord:
        data = json.loads(text)
        data["artifacts"] = [tuple(entry) for entry in data["artifacts"]]
        data["documents"] = [tuple(entry) for entry in data.get("documents", [])]
        return cls(**data)


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
