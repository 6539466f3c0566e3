"""The model registry from the pipeline and the shell: register a scenario's generations (the
register stages, the flows' registration task), promote a version, show the lineage."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject, json_value
from modelupgrade.layout import StudyLayout
from modelupgrade.registry.study import RegistrationSummary


@dataclass
class Registration:
    """What registering a scenario did (the JSON file the register stage writes)."""

    summary: RegistrationSummary
    out: Path

    def as_dict(self) -> JsonObject:
        return self.summary.as_dict()

    def describe(self) -> str:
        s = self.summary
        candidate = f"v{s.candidate}" if s.candidate else "none"
        champion = f"v{s.champion}" if s.champion else "none"
        lines = [f"{s.registered_model}: champion {champion}, candidate {candidate} ({self.out})"]
        for g in s.generations:
            failed = f" (failed: {', '.join(g.failed_gates)})" if g.failed_gates else ""
            lines.append(f"  v{g.version} {g.model_key}: gates {g.gates}{failed}")
        return "\n".join(lines)


def register(
    params: Params,
    scenario: str,
    out: Path | None = None,
    root: Path = Path("."),
    gate_metrics: Path | None = None,
    strategies: Sequence[str] | None = None,
    generations: int | None = None,
    model: str | None = None,
) -> Registration:
    """Register a scenario's generations in the MLflow model registry, gate them, set aliases.

    A scenario registers models/<sc>/gen0 and models/<sc>/gen1-<strategy> for every strategy it
    lists; 'sequential' registers each strategy's chain models/sequential/<strategy>/gen<i> (one
    shared gen0 when the chains start from the same checkpoint). Heads under heads/<sc>/ whose card
    names a model as their new model are logged beside it. The gate numbers come from the evaluate
    stage's files and/or --gate-metrics (format: modelupgrade.registry.evidence), the latter
    winning.

    Args:
        params: the params file: registry section (tracking URI, model name, gates)
        scenario: a scenario of params.yaml, or 'sequential'
        out: JSON summary of the registration (default: registry/<scenario>.json)
        root: the study directory: data/splits, models, embeddings, heads, metrics and plots
            below it (default: the current directory)
        gate_metrics: explicit gate numbers (JSON) that override the measured ones
        strategies: strategies whose models to register (default: the scenario's strategies in
            params.yaml)
        generations: sequential only: register the chains' gen0..gen<N-1> (default: one
            generation per snapshot of sequential.fractions)
        model: registered model name (default: <registry.model_name>-<scenario>)
    """
    from modelupgrade.registry.scenario import register_scenario

    layout = StudyLayout(root)
    out = out or layout.registration(scenario)
    summary = register_scenario(
        params,
        scenario,
        out,
        layout,
        gate_metrics=gate_metrics,
        strategies=strategies,
        generations=generations,
        model=model,
    )
    return Registration(summary, out)


def _existing_tracker(params: Params) -> Any:
    """The tracker of a registry that exists: a local database that is not there is an error, not
    a new empty database (which opening a tracker would create)."""
    from modelupgrade.registry import Tracker
    from modelupgrade.registry.tracking_config import TrackingConfig

    database = TrackingConfig.from_params(params.registry).sqlite_path
    if database is not None and not database.is_file():
        raise UserError(
            f"there is no tracking database at {database}, so no model is registered",
            hint="run from the project root, or run the register stage first "
            "(dvc repro, or python -m stages.register)",
        )
    return Tracker.from_params(params)


def _model_names(tracker: Any, prefix: str) -> list[str]:
    models = tracker.client.search_registered_models()
    return sorted(m.name for m in models if m.name.startswith(prefix + "-"))


def _resolve_model(tracker: Any, params: Params, model: str | None, scenario: str | None) -> str:
    from modelupgrade.registry import registered_model_name

    if model:
        return model
    prefix = params.registry.model_name
    if scenario:
        return registered_model_name(prefix, scenario)
    names = _model_names(tracker, prefix)
    if len(names) == 1:
        return names[0]
    raise UserError(
        "say which registered model: " + (f"there are {len(names)}" if names else "there are none"),
        hint=("pass --scenario or --model; registered: " + ", ".join(names))
        if names
        else "run the register stage first (dvc repro, or python -m stages.register)",
    )


@dataclass
class Promotion:
    """A version promoted to champion."""

    model: str
    result: Any  # modelupgrade.registry.PromotionResult

    def as_dict(self) -> JsonObject:
        r = self.result
        return {
            "registered_model": self.model,
            "version": r.version,
            "previous_champion": r.previous_champion,
            "forced": r.forced,
            "user": r.user,
            "reason": r.reason,
            "notes": r.notes,
        }

    def describe(self) -> str:
        r = self.result
        previous = f"v{r.previous_champion}" if r.previous_champion else "none"
        forced = " with --force" if r.forced else ""
        headline = (
            f"{self.model}: champion is now v{r.version} (was {previous}), "
            f"promoted by {r.user}{forced}: {r.reason}"
        )
        return "\n".join([headline, *(f"note: {note}" for note in r.notes)])


def promote(
    params: Params,
    version: int,
    reason: str,
    force: bool = False,
    scenario: str | None = None,
    model: str | None = None,
) -> Promotion:
    """Move the `champion` alias to a version; refuses one whose gates failed unless --force.

    Args:
        params: the params file: registry section (tracking URI, model name)
        version: model version to make champion
        reason: why (recorded in a version tag)
        force: promote even though the version failed its gates (who and why are tagged)
        scenario: scenario whose registered model to use
        model: registered model name (default: <registry.model_name>-<scenario>)
    """
    from modelupgrade.registry import ModelRegistry
    from modelupgrade.registry import promote as promote_version

    tracker = _existing_tracker(params)
    registry = ModelRegistry(tracker, _resolve_model(tracker, params, model, scenario))
    return Promotion(registry.name, promote_version(registry, version, reason, force=force))


@dataclass
class Lineage:
    """The version trees of registered models."""

    versions: dict[str, list[Any]]  # registered model → modelupgrade.registry.VersionInfo

    def as_dict(self) -> JsonObject:
        from modelupgrade.registry import lineage_rows

        return {
            name: json_value(lineage_rows(versions)) for name, versions in self.versions.items()
        }

    def describe(self) -> str:
        from modelupgrade.registry import format_lineage

        return "\n\n".join(format_lineage(n, v) for n, v in self.versions.items())


def lineage(params: Params, scenario: str | None = None, model: str | None = None) -> Lineage:
    """The generation tree: version, parent, strategy, gates, aliases.

    Args:
        params: the params file: registry section (tracking URI, model name)
        scenario: scenario whose registered model to show (default: every one of the study)
        model: registered model name (default: <registry.model_name>-<scenario>)
    """
    from modelupgrade.registry import ModelRegistry

    tracker = _existing_tracker(params)
    if model or scenario:
        names = [_resolve_model(tracker, params, model, scenario)]
        if not ModelRegistry(tracker, names[0]).exists():
            known = _model_names(tracker, params.registry.model_name)
            raise UserError(
                f"no registered model named {names[0]!r} in {tracker.config.tracking_uri}",
                hint=f"registered: {', '.join(known)}"
                if known
                else "run the register stage first (dvc repro, or python -m stages.register)",
            )
    else:
        names = _model_names(tracker, params.registry.model_name)
        if not names:
            raise UserError(
                f"no registered model named {params.registry.model_name}-<scenario> in "
                f"{tracker.config.tracking_uri}",
                hint="run the register stage first (dvc repro, or python -m stages.register)",
            )
    return Lineage({name: ModelRegistry(tracker, name).versions() for name in names})
