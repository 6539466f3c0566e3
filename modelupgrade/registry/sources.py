"""What a scenario registers and the gate numbers it is judged by, found in the study's files.

A two-model scenario registers ``models/<sc>/gen0`` and ``models/<sc>/gen1-<strategy>`` for every
strategy the scenario lists; ``sequential`` registers each strategy's chain
``models/sequential/<strategy>/gen<i>`` (one shared gen0 when the chains start from the same
checkpoint). Heads under ``heads/<sc>/`` whose card names a model as their new model are logged
beside it: the trained heads and the training-free adapters of ``heads/<sc>/adapters-<strategy>/``
alike. A model adopted from elsewhere (``modelupgrade adopt``) registers under strategy
``adopted`` with its card's provenance (``modelupgrade.registry.forms``). The gate numbers come
from the evaluate stage's files (``metrics/<sc>/``) and/or an explicit file (format:
``modelupgrade.registry.evidence``), the latter winning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.evaluation.summary import read_evaluation
from modelupgrade.heads.persistence import read_head_card
from modelupgrade.io import file_sha256
from modelupgrade.layout import (
    CROSS_MODEL,
    OLD_MODEL,
    SEQUENTIAL,
    SUMMARY,
    StudyLayout,
    chain_model_name,
    model_name,
    snapshot_split,
    training_split,
)
from modelupgrade.models.persistence import CARD_FILE, WEIGHTS_FILE
from modelupgrade.registry.evidence import GateEvidence
from modelupgrade.registry.forms import ADOPTED_STRATEGY, UNKNOWN_DATA, model_form
from modelupgrade.registry.provenance import data_hash_of
from modelupgrade.registry.study import GenerationSource
from modelupgrade.registry.versions import GenerationRecord

# The strategy a scenario's first generation is registered under.
INITIAL_STRATEGY = "initial"


def scenario_sources(
    params: Params,
    scenario: str,
    layout: StudyLayout,
    strategies: Sequence[str] | None = None,
    generations: int | None = None,
) -> list[GenerationSource]:
    """The generations of ``scenario`` in registration order (parents first).

    ``strategies`` defaults to the scenario's in params.yaml; ``generations`` (sequential only:
    the chains' gen0..gen<N-1>) to one per snapshot of ``sequential.fractions``.
    """
    strategies = registered_strategies(params, scenario, strategies)
    if scenario == SEQUENTIAL:
        count = len(params.sequential.fractions) if generations is None else generations
        return _sequential_sources(layout, strategies, count)
    params.scenario(scenario)  # an unknown scenario is an error, whatever the strategies
    if generations is not None:
        raise UserError(
            f"{scenario} is a two-model scenario: it has no chain of generations to count",
            hint="give --generations with --scenario sequential only",
        )
    heads = _heads_by_model(layout.heads(scenario))

    def source(generation: int, strategy: str | None, parent: str | None) -> GenerationSource:
        key = model_name(generation, strategy)
        return _source(
            layout.model(scenario, key),
            key,
            model_name(generation),
            strategy or INITIAL_STRATEGY,
            scenario,
            parent,
            [layout.split_file(scenario, training_split(generation))],
            heads,
        )

    return [
        source(0, None, None),
        *(source(1, strategy, OLD_MODEL) for strategy in strategies),
    ]


def registered_strategies(
    params: Params, scenario: str, strategies: Sequence[str] | None = None
) -> list[str]:
    """The strategies whose models ``scenario`` registers: ``strategies``, else params.yaml's."""
    if strategies is not None:
        return list(strategies)
    if scenario == SEQUENTIAL:
        return list(params.sequential.strategies)
    return list(params.scenario(scenario).strategies)


def _sequential_sources(
    layout: StudyLayout, strategies: Sequence[str], generations: int
) -> list[GenerationSource]:
    heads = _heads_by_model(layout.heads(SEQUENTIAL))
    if not strategies:
        raise UserError("sequential.strategies is empty: there is no chain to register")

    def chain_source(
        key: str, generation: int, strategy: str, parent: str | None, model_dir: Path | None = None
    ) -> GenerationSource:
        """Generation ``generation`` of a chain, trained on that generation's snapshot."""
        return _source(
            model_dir or layout.model(SEQUENTIAL, key),
            key,
            model_name(generation),
            strategy,
            SEQUENTIAL,
            parent,
            [layout.split_file(SEQUENTIAL, snapshot_split(generation))],
            heads,
        )

    shared = layout.model(SEQUENTIAL, OLD_MODEL)
    gen0_dirs = (
        [shared]
        if shared.is_dir()
        else [layout.model(SEQUENTIAL, chain_model_name(s, 0)) for s in strategies]
    )
    shared_gen0 = len(gen0_dirs) == 1 or len({_checkpoint_hash(d) for d in gen0_dirs}) == 1
    sources: list[GenerationSource] = []
    if shared_gen0:
        sources.append(chain_source(OLD_MODEL, 0, INITIAL_STRATEGY, None, gen0_dirs[0]))
    for strategy in strategies:
        parent = OLD_MODEL
        if not shared_gen0:
            parent = chain_model_name(strategy, 0)
            sources.append(chain_source(parent, 0, INITIAL_STRATEGY, None))
        for i in range(1, generations):
            key = chain_model_name(strategy, i)
            sources.append(chain_source(key, i, strategy, parent))
            parent = key
    return sources


def shares_gen0(sources: Sequence[GenerationSource]) -> bool:
    """Whether the chains among ``sources`` start from one registered gen0."""
    return not any(
        "/" in src.record.model_key and src.record.generation == OLD_MODEL for src in sources
    )


def _source(
    model_dir: Path,
    key: str,
    generation: str,
    strategy: str,
    scenario: str,
    parent: str | None,
    data_files: list[Path],
    heads: dict[str, dict[str, Path]],
) -> GenerationSource:
    if not (model_dir / WEIGHTS_FILE).is_file():
        raise UserError(
            f"{model_dir / WEIGHTS_FILE} does not exist: {scenario} {key} is not trained",
            hint="run the train stage for this scenario first (dvc repro)",
        )
    card = model_dir / CARD_FILE
    form = model_form(model_dir)
    record = GenerationRecord(
        model_key=key,
        generation=generation,
        # An adopted model was not trained here: not with a strategy, nor on the split files.
        strategy=ADOPTED_STRATEGY if form.adopted else strategy,
        scenario=scenario,
        parent_key=parent,
        data_hash=UNKNOWN_DATA if form.adopted else data_hash_of([str(p) for p in data_files]),
        checkpoint_sha256=_checkpoint_hash(model_dir),
        model_card=card if card.is_file() else None,
        head_dirs=heads.get(_normalise(model_dir), {}),
        form=form,
    )
    return GenerationSource(record, model_dir)


def _checkpoint_hash(model_dir: Path) -> str:
    path = model_dir / WEIGHTS_FILE
    return file_sha256(path) if path.is_file() else ""


def _normalise(path: str | Path) -> str:
    return str(Path(path).resolve())


def _heads_by_model(heads_root: Path) -> dict[str, dict[str, Path]]:
    """Head directories grouped by the model their card names as the new model."""
    grouped: dict[str, dict[str, Path]] = {}
    if not heads_root.is_dir():
        return grouped
    for card_path in sorted(heads_root.rglob(CARD_FILE)):
        new_model = read_head_card(card_path.parent).source_path("new_model")
        if new_model:
            name = str(card_path.parent.relative_to(heads_root))
            grouped.setdefault(_normalise(new_model), {})[name] = card_path.parent
    return grouped


def load_evidence(
    params: Params,
    scenario: str,
    metrics_dir: Path,
    gate_metrics: Path | None,
    shared_gen0: bool = True,
    strategies: Sequence[str] | None = None,
) -> GateEvidence:
    """Gate numbers from the evaluate stage's files in ``metrics_dir`` (``metrics/<sc>``, for the
    sequential scenario ``metrics/sequential/<strategy>`` of each chain), overridden by an explicit
    JSON file."""
    metric = params.registry.gate_metric or params.evaluation.headline_metric
    evidence = GateEvidence(metric)
    if scenario == SEQUENTIAL:
        evaluated = [
            (metrics_dir / strategy, _sequential_key(strategy, shared_gen0))
            for strategy in registered_strategies(params, scenario, strategies)
        ]
    else:
        evaluated = [(metrics_dir, _same_name)]
    for directory, model_key in evaluated:
        table_path = directory / f"{CROSS_MODEL}.parquet"
        if table_path.is_file():
            evidence = evidence.merged(
                GateEvidence.from_cross_model_table(
                    pd.read_parquet(table_path),
                    metric,
                    model_key,
                    degradation_pct=_degradation(directory),
                )
            )
    if gate_metrics is not None:
        evidence = evidence.merged(GateEvidence.from_file(gate_metrics))
    return evidence


def _same_name(name: str) -> str:
    return name


def _sequential_key(strategy: str, shared_gen0: bool) -> Callable[[str], str]:
    def key(generation: str) -> str:
        if generation == OLD_MODEL and shared_gen0:
            return OLD_MODEL
        return f"{strategy}/{generation}"

    return key


def _degradation(metrics_dir: Path) -> dict[str, float]:
    """Δ↓ per model of the evaluation in ``metrics_dir``, as its ``summary.json`` holds it (the
    evaluation's names: ``gen1-bct``; ``gen2`` of a chain)."""
    path = metrics_dir / f"{SUMMARY}.json"
    if not path.is_file():
        return {}
    return read_evaluation(path).delta_down_pct
