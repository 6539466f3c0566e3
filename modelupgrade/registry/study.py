"""Register a batch of generations in order, gate each against the champion, set the aliases.

The first generation of an empty registry becomes ``champion``. Every later one is gated against
the champion of the moment; of the versions in the batch that pass, the one whose queries search
the champion's gallery best becomes ``candidate``. ``champion`` itself only moves by ``promote``:
a person decides when the gallery is re-served by a new model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelupgrade.config import GateParams
from modelupgrade.json_data import JsonObject, json_record
from modelupgrade.registry.evidence import GateEvidence
from modelupgrade.registry.forms import PYTORCH
from modelupgrade.registry.promotion import gate_version
from modelupgrade.registry.tracker import StageRun
from modelupgrade.registry.versions import CANDIDATE, CHAMPION, GenerationRecord, ModelRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationSource:
    record: GenerationRecord
    model_dir: Path


@dataclass
class RegistrationOutcome:
    model_key: str
    version: int
    gates: str
    failed_gates: list[str] = field(default_factory=list)
    cross_score: float | None = None
    compatible_with: list[int] = field(default_factory=list)
    aliases: list[str] = field(default_factory=list)

    def as_dict(self) -> JsonObject:
        return json_record(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RegistrationOutcome:
        return cls(**data)


@dataclass(frozen=True)
class RegistrationSummary:
    """What registering a batch of generations did: the register stage's JSON file, the value the
    flows pass from their registration task to the upgrade report (``as_dict`` / ``from_dict``:
    the one codec of both)."""

    registered_model: str
    tracking_uri: str
    gate_metric: str
    champion: int | None
    candidate: int | None
    generations: tuple[RegistrationOutcome, ...]

    def outcome(self, model_key: str) -> RegistrationOutcome:
        """What happened to the generation registered as ``model_key``."""
        return next(o for o in self.generations if o.model_key == model_key)

    def as_dict(self) -> JsonObject:
        return {**json_record(self), "generations": [o.as_dict() for o in self.generations]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RegistrationSummary:
        outcomes = tuple(RegistrationOutcome.from_dict(o) for o in data["generations"])
        return cls(**{**data, "generations": outcomes})


def register_generations(
    registry: ModelRegistry,
    sources: Sequence[GenerationSource],
    load_model: Callable[[Path], Any],
    evidence: GateEvidence,
    gate_params: GateParams,
    stage_run: StageRun,
) -> list[RegistrationOutcome]:
    """Register ``sources`` (parents before children) and return what happened to each."""
    outcomes: list[RegistrationOutcome] = []
    for source in sources:
        # A model logged as files is not loaded: an embeddings-only one holds every vector.
        pickled = source.record.form.logged_as == PYTORCH
        model = load_model(source.model_dir) if pickled else None
        info = registry.register(model, source.record, stage_run)
        outcome = RegistrationOutcome(source.record.model_key, info.version, "")
        champion = registry.champion()
        if champion is None:
            registry.set_alias(CHAMPION, info.version)
            registry.mark_first_generation(info.version)
            outcome.gates = "first-generation"
        elif champion.version == info.version:
            outcome.gates = registry.version(info.version).gates_status
        else:
            inputs = evidence.gate_inputs(source.record.model_key, champion.model_key)
            report = gate_version(registry, info.version, inputs, gate_params)
            outcome.gates = "pass" if report.passed else "fail"
            outcome.failed_gates = [c.name for c in report.failures]
            outcome.cross_score = inputs.cross_score
            stage_run.log_metrics(
                {
                    f"{_metric_key(source.record.model_key)}.{c.name}": c.value
                    for c in report.checks
                    if c.value is not None
                }
            )
        outcomes.append(outcome)

    _update_compatibility(registry, evidence, outcomes)
    _choose_candidate(registry, outcomes)
    by_version = {v.version: v for v in registry.versions()}
    for outcome in outcomes:
        outcome.aliases = by_version[outcome.version].aliases
    return outcomes


def _update_compatibility(
    registry: ModelRegistry, evidence: GateEvidence, outcomes: list[RegistrationOutcome]
) -> None:
    """Tag every version with the galleries its queries can search (evidence permitting)."""
    versions = registry.versions()
    version_of = {v.model_key: v.version for v in versions}
    keys = list(version_of)
    for v in versions:
        if not any(q == v.model_key for q, _ in evidence.cross):
            continue
        galleries = sorted(version_of[k] for k in evidence.compatible_galleries(v.model_key, keys))
        registry.set_compatible_with(v.version, galleries)
        for outcome in outcomes:
            if outcome.version == v.version:
                outcome.compatible_with = galleries


def _choose_candidate(registry: ModelRegistry, outcomes: list[RegistrationOutcome]) -> None:
    passed = [o for o in outcomes if o.gates == "pass" and o.cross_score is not None]
    if not passed:
        return
    best = max(passed, key=lambda o: (o.cross_score, o.version))
    registry.set_alias(CANDIDATE, best.version)
    log.info("%s: candidate -> v%d (%s)", registry.name, best.version, best.model_key)


def _metric_key(model_key: str) -> str:
    return "gate." + model_key.replace("/", "_")
