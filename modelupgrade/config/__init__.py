"""The typed schema of params.yaml, the single source of configuration.

Every section is a strict pydantic model: a wrong type or an unknown key is an error that names
the key and says what is expected. This package is a leaf of the library: it imports nothing else
of ``modelupgrade`` (loading params.yaml loads neither torch nor a plugin), so it checks structure
only, and plugin names (strategy and head kinds, ordering policies, serving modes) are plain strings
here. ``modelupgrade.params.load_params`` is the only way the code reads params.yaml: it reads the
file with ``read_params`` and checks every plugin reference against the registries.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NewType

import yaml
from pydantic import Field, PrivateAttr, ValidationError, model_validator

from modelupgrade.config.adoption import AdoptionParams
from modelupgrade.config.backfill import BackfillParams
from modelupgrade.config.base import Section
from modelupgrade.config.data import (
    DatasetParams,
    EvaluationSplitParams,
    ScenarioParams,
    SequentialParams,
    StudyParams,
)
from modelupgrade.config.errors import ParamsError, invalid_params, validation_problems
from modelupgrade.config.evaluation import EvaluationParams
from modelupgrade.config.flows import FlowParams
from modelupgrade.config.heads import AdapterStudyParams, HeadParams, HeadTraining
from modelupgrade.config.registry import GateParams, RegistryParams
from modelupgrade.config.replicates import SEED_SPACING, ReplicateParams, ReplicateScenario
from modelupgrade.config.store import StoreParams
from modelupgrade.config.training import (
    ArchitectureParams,
    PretrainedWeights,
    StrategyParams,
    TrainingParams,
)
from modelupgrade.config.upgrades import UpgradeParams

DEFAULT_PARAMS_PATH = Path("params.yaml")
# The path of a params file, as text: what a Prefect flow takes (a deployment stores its parameters
# as JSON, so a flow reads params.yaml itself). Its command-line option is --params.
ParamsFile = NewType("ParamsFile", str)
DEFAULT_PARAMS_FILE = ParamsFile(str(DEFAULT_PARAMS_PATH))

__all__ = [
    "AdapterStudyParams",
    "AdoptionParams",
    "ArchitectureParams",
    "BackfillParams",
    "DatasetParams",
    "EvaluationParams",
    "EvaluationSplitParams",
    "FlowParams",
    "GateParams",
    "HeadParams",
    "HeadTraining",
    "Params",
    "ParamsError",
    "ParamsFile",
    "PretrainedWeights",
    "RegistryParams",
    "ReplicateParams",
    "ReplicateScenario",
    "ScenarioParams",
    "SequentialParams",
    "StoreParams",
    "StrategyParams",
    "StudyParams",
    "TrainingParams",
    "UpgradeParams",
    "params_hash",
    "parse_params",
    "read_params",
]


class Params(Section):
    seed: int = 666
    device: str = "auto"
    dataset: DatasetParams = Field(default_factory=DatasetParams)
    evaluation_split: EvaluationSplitParams = Field(default_factory=EvaluationSplitParams)
    # What runs (dvc.yaml iterates it); None: every scenario defined, and the sequential chains
    # where they have strategies.
    study: StudyParams | None = None
    scenarios: dict[str, ScenarioParams]
    sequential: SequentialParams = Field(default_factory=SequentialParams)
    architectures: dict[str, ArchitectureParams]
    # Models made elsewhere, by name: what `modelupgrade adopt --model NAME` brings in.
    adopted: dict[str, AdoptionParams] = Field(default_factory=dict)
    # A team's own upgrades, by name: dvc.yaml's upgrade@<name> plans and reports each.
    upgrades: dict[str, UpgradeParams] = Field(default_factory=dict)
    training: TrainingParams = Field(default_factory=TrainingParams)
    strategies: dict[str, StrategyParams]
    heads: dict[str, HeadParams] = Field(default_factory=dict)
    adapters: AdapterStudyParams = Field(default_factory=AdapterStudyParams)
    replicates: ReplicateParams = Field(default_factory=ReplicateParams)
    evaluation: EvaluationParams = Field(default_factory=EvaluationParams)
    backfill: BackfillParams = Field(default_factory=BackfillParams)
    registry: RegistryParams = Field(default_factory=RegistryParams)
    store: StoreParams = Field(default_factory=StoreParams)
    flows: FlowParams = Field(default_factory=FlowParams)
    # The file these params were read from (what a command tells a person to pass again).
    _source: Path = PrivateAttr(default=DEFAULT_PARAMS_PATH)

    @property
    def source(self) -> Path:
        return self._source

    @property
    def studied(self) -> dict[str, ScenarioParams]:
        """The scenarios the study runs, in its order."""
        names = self.study.scenarios if self.study is not None else list(self.scenarios)
        return {name: self.scenarios[name] for name in names}

    @property
    def runs_sequential(self) -> bool:
        if self.study is not None:
            return bool(self.study.sequential)
        return bool(self.sequential.strategies)

    @model_validator(mode="after")
    def _cross_references_exist(self) -> Params:
        for name, scenario in self.scenarios.items():
            for arch in (scenario.old_architecture, scenario.new_architecture):
                if arch not in self.architectures:
                    raise ValueError(
                        f"scenarios.{name} uses architecture {arch!r}, which is not defined under "
                        f"'architectures' (defined: {sorted(self.architectures)})"
                    )
            for strategy in scenario.strategies:
                if strategy not in self.strategies:
                    raise ValueError(
                        f"scenarios.{name} lists strategy {strategy!r}, which is not defined under "
                        f"'strategies' (defined: {sorted(self.strategies)})"
                    )
            for head, strategy in scenario.heads.items():
                if head not in self.heads:
                    raise ValueError(
                        f"scenarios.{name}.heads names head {head!r}, which is not defined under "
                        f"'heads' (defined: {sorted(self.heads)})"
                    )
                if strategy not in scenario.strategies:
                    raise ValueError(
                        f"scenarios.{name}.heads pairs head {head!r} with strategy {strategy!r}, "
                        f"which the scenario does not train (its strategies: {scenario.strategies})"
                    )
        self._study_runs_what_it_trains()
        self._scenarios_defined("adapters.scenarios", self.adapters.scenarios)
        for name, strategy in self.adapters.scenarios.items():
            if strategy not in self.scenarios[name].strategies:
                raise ValueError(
                    f"adapters.scenarios pairs {name!r} with strategy {strategy!r}, which the "
                    f"scenario does not train (its strategies: {self.scenarios[name].strategies})"
                )
        for strategy in self.sequential.strategies:
            if strategy not in self.strategies:
                raise ValueError(f"sequential.strategies lists undefined strategy {strategy!r}")
        for strategy, head in self.sequential.heads.items():
            if strategy not in self.sequential.strategies:
                raise ValueError(
                    f"sequential.heads gives a head to chain {strategy!r}, which "
                    f"sequential.strategies does not train (its chains: "
                    f"{self.sequential.strategies})"
                )
            if head not in self.heads:
                raise ValueError(
                    f"sequential.heads names head {head!r}, which is not defined under 'heads' "
                    f"(defined: {sorted(self.heads)})"
                )
        self._replicates_exist()
        self._upgrades_adopt_their_models()
        return self

    def _upgrades_adopt_their_models(self) -> None:
        for name, upgrade in self.upgrades.items():
            for role, model in (("old", upgrade.old), ("new", upgrade.new)):
                if model not in self.adopted:
                    raise ValueError(
                        f"upgrades.{name}.{role} names model {model!r}, which is not defined under "
                        f"'adopted' (defined: {sorted(self.adopted)})"
                    )

    def _study_runs_what_it_trains(self) -> None:
        """Every scenario the study names is defined; one it does not run trains nothing (dvc.yaml
        makes its strategy and head stages from its lists, which would then have no old model);
        so do the sequential chains when the study does not run them."""
        if self.study is None:
            return
        self._scenarios_defined("study.scenarios", self.study.scenarios)
        for name, scenario in self.scenarios.items():
            if name not in self.study.scenarios and (scenario.strategies or scenario.heads):
                raise ValueError(
                    f"scenarios.{name} trains {scenario.strategies or sorted(scenario.heads)} "
                    f"but study.scenarios does not run it; add it to study.scenarios or empty "
                    f"its strategies and heads"
                )
        if not self.study.sequential and (self.sequential.strategies or self.sequential.heads):
            raise ValueError(
                "sequential.strategies are set but study.sequential does not run the chains; "
                "set study.sequential: [sequential] or empty sequential.strategies and heads"
            )
        for section, names in (
            ("adapters.scenarios", self.adapters.scenarios),
            ("replicates.scenarios", self.replicates.scenarios),
        ):
            for name in names:
                if name not in self.study.scenarios:
                    raise ValueError(
                        f"{section} names scenario {name!r}, which study.scenarios does not run "
                        f"(it runs: {self.study.scenarios})"
                    )

    def _scenarios_defined(self, section: str, names: Iterable[str]) -> None:
        for name in names:
            if name not in self.scenarios:
                raise ValueError(
                    f"{section} names scenario {name!r}, which is not defined under "
                    f"'scenarios' (defined: {sorted(self.scenarios)})"
                )

    def _replicates_exist(self) -> None:
        for seed in self.replicates.seeds:
            for other in (self.seed, *self.replicates.seeds):
                if other != seed and abs(other - seed) < SEED_SPACING:
                    raise ValueError(
                        f"replicates.seeds: {seed} is within {SEED_SPACING} of seed {other}, so "
                        f"their derived seeds (seed + generation, seed + permutation) overlap; "
                        f"space the seeds further apart"
                    )
            if seed == self.seed:
                raise ValueError(f"replicates.seeds repeats the study's own seed {seed}")
        for field, chosen, study in (
            ("policies", self.replicates.policies, self.backfill.policies),
            ("serving_modes", self.replicates.serving_modes, self.backfill.serving_modes),
        ):
            unknown = [name for name in chosen if name not in study]
            if unknown:
                raise ValueError(
                    f"replicates.{field} lists {unknown}, which backfill.{field} does not "
                    f"simulate (it has: {study})"
                )
        self._scenarios_defined("replicates.scenarios", self.replicates.scenarios)
        for name, replicate in self.replicates.scenarios.items():
            scenario = self.scenarios[name]
            trained = {"strategy": scenario.strategies, "head": sorted(scenario.heads)}
            for kind, listed in (("strategy", replicate.strategies), ("head", replicate.heads)):
                unknown = [item for item in listed if item not in trained[kind]]
                if unknown:
                    raise ValueError(
                        f"replicates.scenarios.{name} lists {kind} {unknown[0]!r}, which the "
                        f"scenario does not train (its {kind}s: {trained[kind]})"
                    )
            unpaired = [h for h in replicate.heads if scenario.heads[h] not in replicate.strategies]
            if unpaired:
                raise ValueError(
                    f"replicates.scenarios.{name}: head {unpaired[0]!r} pairs with strategy "
                    f"{scenario.heads[unpaired[0]]!r}, which the replicates do not train; add it "
                    f"to their strategies"
                )

    def scenario(self, name: str) -> ScenarioParams:
        try:
            return self.scenarios[name]
        except KeyError:
            raise ParamsError(
                f"unknown scenario {name!r}",
                hint=f"params.yaml defines: {', '.join(self.scenarios)}",
            ) from None


def parse_params(raw: dict[str, Any], source: Path = DEFAULT_PARAMS_PATH) -> Params:
    """The structure of ``raw`` checked (plugin names unchecked: see ``modelupgrade.params``)."""
    try:
        params = Params.model_validate(raw)
    except ValidationError as err:
        raise invalid_params(
            source,
            validation_problems(err),
            hint="see the schema in modelupgrade/config/ and the defaults in params.yaml",
        ) from None
    params._source = Path(source)
    return params


def read_params(path: str | Path = DEFAULT_PARAMS_PATH) -> Params:
    """The params file at ``path``, its structure checked (front ends call
    ``modelupgrade.params.load_params``, which also checks the plugin names)."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file {path} does not exist", hint="run from the project root")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ParamsError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path} must hold a mapping at the top level, got {type(raw).__name__}")
    return parse_params(raw, path)


def params_hash(params: Params) -> str:
    """A stable hash of the effective configuration (for lineage tags and reports)."""
    canonical = json.dumps(params.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
