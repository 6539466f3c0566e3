"""Register one scenario of the study: its generations, gated on its evaluation, in one stage run.

The register stage, the ``register`` command and the flows' registration task run
``register_scenario``; ``modelupgrade.registry.sources`` finds what it registers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from modelupgrade.config import Params
from modelupgrade.io import write_json
from modelupgrade.layout import StudyLayout
from modelupgrade.registry.lineage import format_lineage
from modelupgrade.registry.sources import load_evidence, scenario_sources, shares_gen0
from modelupgrade.registry.study import RegistrationSummary, register_generations
from modelupgrade.registry.tracker import Tracker
from modelupgrade.registry.versions import CANDIDATE, ModelRegistry, registered_model_name

log = logging.getLogger(__name__)


def _load_model(model_dir: Path) -> Any:
    from modelupgrade.models import load_model

    return load_model(model_dir)


def register_scenario(
    params: Params,
    scenario: str,
    out: Path,
    layout: StudyLayout,
    *,
    gate_metrics: Path | None = None,
    load_model: Callable[[Path], Any] | None = None,
    tracker: Tracker | None = None,
    strategies: Sequence[str] | None = None,
    generations: int | None = None,
    model: str | None = None,
) -> RegistrationSummary:
    """Register ``scenario``'s generations and write what happened to ``out`` (JSON); returns it.

    The gates read the scenario's evaluation in ``layout`` (``metrics/<sc>``); ``gate_metrics``
    overrides measured numbers. ``strategies`` and ``generations`` say which models (see
    ``scenario_sources``), ``model`` the registered model (default:
    ``<registry.model_name>-<scenario>``). ``load_model`` and ``tracker`` default to the saved
    models and the store params.yaml names.
    """
    sources = scenario_sources(params, scenario, layout, strategies, generations)
    evidence = load_evidence(
        params,
        scenario,
        layout.metrics(scenario),
        gate_metrics,
        shares_gen0(sources),
        strategies,
    )
    tracker = tracker or Tracker.from_params(params)
    registry = ModelRegistry(
        tracker, model or registered_model_name(params.registry.model_name, scenario)
    )
    with tracker.stage_run(
        f"register@{scenario}",
        params={
            "scenario": scenario,
            "registered_model": registry.name,
            "registry": params.registry,
        },
        tags={"scenario": scenario},
    ) as stage:
        outcomes = register_generations(
            registry, sources, load_model or _load_model, evidence, params.registry.gates, stage
        )
        champion = registry.champion()
        candidate = registry.by_alias(CANDIDATE)
        summary = RegistrationSummary(
            registered_model=registry.name,
            tracking_uri=tracker.config.tracking_uri,
            gate_metric=evidence.metric,
            champion=champion.version if champion else None,
            candidate=candidate.version if candidate else None,
            generations=tuple(outcomes),
        )
        write_json(out, summary.as_dict())
        stage.log_artifact(out, "registry")
        lineage = format_lineage(registry.name, registry.versions())
        stage.log_dict({"lineage": lineage.splitlines()}, "registry/lineage.json")
    log.info("\n%s", lineage)
    return summary
