"""The model registry of one retrieval system: one registered model, one version per generation.

A version holds the embedding model (``mlflow.pytorch`` flavour, loadable with
``mlflow.pytorch.load_model("models:/<name>@champion")``; an adopted TorchScript or embeddings-only
model is logged as files instead, see ``modelupgrade.registry.forms``); its adapters and reverse
heads are logged beside it as artifacts of the run that registered it. Lineage lives in version
tags (see ``TAG_*``), promotion in the aliases ``candidate`` and ``champion``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelupgrade.errors import UserError
from modelupgrade.registry.forms import (
    CARD_ONLY,
    EMBEDDINGS_RECORD,
    MODEL_DIRECTORY,
    PYTORCH,
    TAG_LOGGED_AS,
    ModelForm,
    embeddings_record,
    head_tags,
    not_loadable,
)
from modelupgrade.registry.gates import GateReport
from modelupgrade.registry.provenance import git_commit
from modelupgrade.registry.tracker import StageRun, Tracker, fluent_tracking_uri

log = logging.getLogger(__name__)

CHAMPION = "champion"
CANDIDATE = "candidate"

TAG_MODEL_KEY = "model_key"
TAG_GENERATION = "generation"
TAG_PARENT_VERSION = "parent_version"
TAG_STRATEGY = "strategy"
TAG_SCENARIO = "scenario"
TAG_COMPATIBLE_WITH = "compatible_with"
TAG_DATA_HASH = "data_hash"
TAG_GIT_COMMIT = "git_commit"
TAG_CHECKPOINT = "checkpoint_sha256"
TAG_HEADS = "heads"
TAG_GATES_PASSED = "gates.passed"
TAG_GATES_AGAINST = "gates.against_version"
FIRST_GENERATION = "first-generation"
NO_PARENT = "none"


@dataclass(frozen=True)
class GenerationRecord:
    """What the registry needs to know about one trained generation.

    ``model_key`` names the model inside its scenario (``gen0``, ``gen1-bct``, ``bct/gen2``) and
    ties a version back to the files under ``models/``; ``parent_key`` is the generation it was
    made compatible with (None for gen0).
    """

    model_key: str
    generation: str
    strategy: str
    scenario: str
    parent_key: str | None = None
    data_hash: str = "none"
    checkpoint_sha256: str = ""
    model_card: Path | None = None
    head_dirs: Mapping[str, Path] = field(default_factory=dict)
    extra_tags: Mapping[str, str] = field(default_factory=dict)
    # How the model is logged (the mlflow.pytorch flavour, or files of its directory).
    form: ModelForm = field(default_factory=ModelForm)


@dataclass(frozen=True)
class VersionInfo:
    version: int
    tags: dict[str, str]
    aliases: list[str]
    run_id: str | None

    @property
    def model_key(self) -> str:
        return self.tags.get(TAG_MODEL_KEY, f"v{self.version}")

    @property
    def parent_version(self) -> int | None:
        raw = self.tags.get(TAG_PARENT_VERSION, NO_PARENT)
        return int(raw) if raw.isdigit() else None

    @property
    def gates_status(self) -> str:
        return self.tags.get(TAG_GATES_PASSED, "not evaluated")

    @property
    def promotable(self) -> bool:
        return self.gates_status in ("true", FIRST_GENERATION)


def registered_model_name(prefix: str, scenario: str) -> str:
    return f"{prefix}-{scenario}"


class ModelRegistry:
    """Versions, tags and aliases of one registered model; every write holds the store's lock."""

    def __init__(self, tracker: Tracker, name: str) -> None:
        self.tracker = tracker
        self.client = tracker.client
        self.name = name

    # -- reading -------------------------------------------------------------------------------

    def exists(self) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(self.name)
        except MlflowException:
            return False
        return True

    def versions(self) -> list[VersionInfo]:
        if not self.exists():
            return []
        found = self.client.search_model_versions(f"name='{self.name}'")
        # Search results leave aliases out; the registered model maps each alias to its version.
        aliases: dict[int, list[str]] = {}
        for alias, version in (self.client.get_registered_model(self.name).aliases or {}).items():
            aliases.setdefault(int(version), []).append(alias)
        infos = [self._info(mv, aliases.get(int(mv.version), [])) for mv in found]
        return sorted(infos, key=lambda v: v.version)

    def version(self, version: int) -> VersionInfo:
        from mlflow.exceptions import MlflowException

        try:
            mv = self.client.get_model_version(self.name, str(version))
        except MlflowException:
            known = ", ".join(str(v.version) for v in self.versions()) or "none"
            raise UserError(
                f"registered model {self.name!r} has no version {version}",
                hint=f"existing versions: {known} (see `modelupgrade lineage`)",
            ) from None
        return self._info(mv)

    def by_alias(self, alias: str) -> VersionInfo | None:
        from mlflow.exceptions import MlflowException

        if not self.exists():
            return None
        try:
            mv = self.client.get_model_version_by_alias(self.name, alias)
        except MlflowException:
            return None
        return self._info(mv)

    def champion(self) -> VersionInfo | None:
        return self.by_alias(CHAMPION)

    def by_key(self, model_key: str) -> VersionInfo | None:
        """The newest version registered for ``model_key`` (a re-run registers a new one)."""
        matches = [v for v in self.versions() if v.model_key == model_key]
        return matches[-1] if matches else None

    def model_uri(self, version: int | None = None, alias: str | None = None) -> str:
        if alias is not None:
            return f"models:/{self.name}@{alias}"
        return f"models:/{self.name}/{version}"

    def load_model(self, version: int | None = None, alias: str | None = None) -> Any:
        """The ``torch.nn.Module`` of a version (by number or alias), in eval mode: unpickled
        from its ``mlflow.pytorch`` flavour, or rebuilt by modelupgrade from its logged model
        directory (an adopted TorchScript model). An embeddings-only version is an error."""
        import tempfile

        import mlflow.pytorch
        from mlflow.artifacts import download_artifacts

        info = self.by_alias(alias) if alias is not None else self.version(version or 0)
        if info is None:
            raise UserError(f"registered model {self.name!r} has no alias {alias!r}")
        logged_as = info.tags.get(TAG_LOGGED_AS, PYTORCH)
        if logged_as == CARD_ONLY:
            raise not_loadable(self.name, info.version, info.model_key)
        uri = self.model_uri(version, alias)
        with fluent_tracking_uri(self.tracker.config.tracking_uri):
            if logged_as == MODEL_DIRECTORY:
                from modelupgrade.models import load_model

                with tempfile.TemporaryDirectory() as tmp:
                    # torch.jit.load reads the whole file: the copy can go once it is loaded.
                    model = load_model(download_artifacts(artifact_uri=uri, dst_path=tmp))
            else:
                model = mlflow.pytorch.load_model(uri, map_location="cpu")
        return model.eval()

    def _info(self, mv: Any, aliases: list[str] | None = None) -> VersionInfo:
        return VersionInfo(
            version=int(mv.version),
            tags=dict(mv.tags or {}),
            aliases=sorted(
                aliases if aliases is not None else (getattr(mv, "aliases", None) or [])
            ),
            run_id=mv.run_id,
        )

    # -- writing -------------------------------------------------------------------------------

    def register(self, model: Any, record: GenerationRecord, stage_run: StageRun) -> VersionInfo:
        """Log ``model`` with its heads under ``stage_run`` and register it as a new version.

        Registering the same checkpoint again (a re-run of the stage) returns the existing version
        instead of adding a duplicate.
        """
        existing = self.by_key(record.model_key)
        if (
            existing is not None
            and record.checkpoint_sha256
            and existing.tags.get(TAG_CHECKPOINT) == record.checkpoint_sha256
        ):
            log.info(
                "%s: %s already registered as version %d",
                self.name,
                record.model_key,
                existing.version,
            )
            return existing

        parent = self.by_key(record.parent_key) if record.parent_key else None
        if record.parent_key and parent is None:
            raise UserError(
                f"{record.model_key} names parent {record.parent_key!r}, which is not registered "
                f"in {self.name!r}",
                hint="register generations in order: the parent first",
            )
        tags = {
            TAG_MODEL_KEY: record.model_key,
            TAG_GENERATION: record.generation,
            TAG_PARENT_VERSION: str(parent.version) if parent else NO_PARENT,
            TAG_STRATEGY: record.strategy,
            TAG_SCENARIO: record.scenario,
            TAG_DATA_HASH: record.data_hash,
            TAG_GIT_COMMIT: git_commit(),
            TAG_HEADS: ",".join(sorted(record.head_dirs)) or "none",
            TAG_COMPATIBLE_WITH: NO_PARENT,
            TAG_GATES_PASSED: "not evaluated",
            TAG_LOGGED_AS: record.form.logged_as,
            **head_tags(record.head_dirs),
            **dict(record.form.tags or {}),
            **dict(record.extra_tags),
        }
        if record.checkpoint_sha256:
            tags[TAG_CHECKPOINT] = record.checkpoint_sha256
        for head_name, head_dir in sorted(record.head_dirs.items()):
            stage_run.log_artifact(head_dir, f"{record.model_key}/heads/{head_name}")
        if record.model_card is not None and Path(record.model_card).is_file():
            stage_run.log_artifact(record.model_card, f"{record.model_key}")
        if record.form.logged_as == PYTORCH:
            model_info = self._log_model(model, record, stage_run)
            source, model_id = model_info.model_uri, getattr(model_info, "model_id", None)
        else:
            source, model_id = self._log_files(record, stage_run), None
        # MLflow resolves the logged model behind the version through its process-wide URI.
        with (
            self.tracker.config.writer_lock(),
            fluent_tracking_uri(self.tracker.config.tracking_uri),
        ):
            self._ensure_registered_model()
            mv = self.client.create_model_version(
                self.name,
                source=source,
                run_id=stage_run.run_id,
                tags=tags,
                model_id=model_id,
                description=f"{record.scenario} {record.model_key} (strategy {record.strategy})",
            )
        log.info("%s: registered %s as version %s", self.name, record.model_key, mv.version)
        return self.version(int(mv.version))

    def _log_model(self, model: Any, record: GenerationRecord, stage_run: StageRun) -> Any:
        import mlflow
        import mlflow.pytorch
        import torch

        requirements = [f"torch=={torch.__version__.split('+')[0]}"]
        # The run starts (or resumes) after the lock is held and the tracking URI is set.
        with (
            self.tracker.config.writer_lock(),
            fluent_tracking_uri(self.tracker.config.tracking_uri),
            mlflow.start_run(run_id=stage_run.run_id, nested=mlflow.active_run() is not None),
        ):
            # Explicit requirements: inferring them would import and run the model in a
            # subprocess, which is slow and needs nothing the torch pin does not say.
            # Pickle, not the 'pt2' export: an exported graph may fix the batch size, and a
            # retrieval model must embed batches of any size; loading needs modelupgrade
            # importable, which every consumer of these models has.
            return mlflow.pytorch.log_model(
                model,
                name=_artifact_name(record.model_key),
                pip_requirements=requirements,
                serialization_format="pickle",
            )

    def _log_files(self, record: GenerationRecord, stage_run: StageRun) -> str:
        """Log a model that is not pickled (``record.form``) as files of the registering run;
        returns the ``runs:/`` URI of their folder, the version's source."""
        folder = f"{record.model_key}/{_artifact_name(record.model_key)}"
        for path in record.form.files:
            stage_run.log_artifact(path, folder)
        if record.form.logged_as == CARD_ONLY:
            model_dir = Path(record.form.files[0]).parent
            stage_run.log_dict(embeddings_record(model_dir), f"{folder}/{EMBEDDINGS_RECORD}")
        return f"runs:/{stage_run.run_id}/{folder}"

    def _ensure_registered_model(self) -> None:
        if not self.exists():
            self.client.create_registered_model(
                self.name,
                description="Embedding model generations of one retrieval system "
                "(modelupgrade). Aliases: champion = serving, candidate = passed the gates.",
            )

    def set_tags(self, version: int, tags: Mapping[str, str]) -> None:
        with self.tracker.config.writer_lock():
            for key, value in tags.items():
                self.client.set_model_version_tag(self.name, str(version), key, str(value))

    def record_gates(self, version: int, report: GateReport, against: int) -> None:
        self.set_tags(version, {**report.to_tags(), TAG_GATES_AGAINST: str(against)})

    def mark_first_generation(self, version: int) -> None:
        self.set_tags(version, {TAG_GATES_PASSED: FIRST_GENERATION, TAG_GATES_AGAINST: NO_PARENT})

    def set_compatible_with(self, version: int, galleries: list[int]) -> None:
        listed = ",".join(str(v) for v in sorted(galleries))
        self.set_tags(version, {TAG_COMPATIBLE_WITH: listed or NO_PARENT})

    def set_alias(self, alias: str, version: int) -> None:
        with self.tracker.config.writer_lock():
            self.client.set_registered_model_alias(self.name, alias, str(version))

    def delete_alias(self, alias: str) -> None:
        if self.by_alias(alias) is None:
            return
        with self.tracker.config.writer_lock():
            self.client.delete_registered_model_alias(self.name, alias)


def _artifact_name(model_key: str) -> str:
    # Logged-model names may not contain '/' (sequential keys look like 'bct/gen2').
    return "embedder-" + model_key.replace("/", "-").replace(os.sep, "-")
