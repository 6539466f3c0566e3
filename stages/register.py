"""Stage: register a scenario's generations in the MLflow model registry, gate them, set aliases.

    python -m stages.register --scenario extended-data --out registry/extended-data.json
    python -m stages.register --scenario sequential --out registry/sequential.json

A scenario registers ``models/<scenario>/gen0`` and ``models/<scenario>/gen1-<strategy>`` for every
strategy the scenario lists; ``sequential`` registers each strategy's chain
``models/sequential/<strategy>/gen<i>`` (one shared gen0 when the chains start from the same
checkpoint). Adapters and reverse heads under ``heads/<scenario>/`` whose card names a model as
their new model are logged beside it. The gate numbers come from the evaluate stage's files and/or
``--gate-metrics`` (format: ``modelupgrade.registry.evidence``), the latter winning.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from modelupgrade.config import Params
from modelupgrade.errors import UserError, exit_on_user_error
from modelupgrade.io import file_sha256, read_json, write_json
from modelupgrade.plugins import load_params
from modelupgrade.registry import (
    GateEvidence,
    GenerationRecord,
    GenerationSource,
    ModelRegistry,
    Tracker,
    data_hash_of,
    format_lineage,
    register_generations,
    registered_model_name,
)
from modelupgrade.runtime import setup_logging

log = logging.getLogger(__name__)

SEQUENTIAL = "sequential"
INITIAL_STRATEGY = "initial"
CHECKPOINT_FILE = "checkpoint.pt"
CARD_FILE = "card.json"


def scenario_sources(
    params: Params, scenario: str, models_dir: Path, heads_dir: Path, splits_dir: Path
) -> list[GenerationSource]:
    """The generations of ``scenario`` in registration order (parents first)."""
    if scenario == SEQUENTIAL:
        return _sequential_sources(params, models_dir, heads_dir, splits_dir)
    scenario_params = params.scenario(scenario)
    base = models_dir / scenario
    splits = splits_dir / scenario
    heads = _heads_by_model(heads_dir / scenario)
    sources = [
        _source(base / "gen0", "gen0", "gen0", INITIAL_STRATEGY, scenario, None,
                [splits / "old_train.parquet"], heads)
    ]
    for strategy in scenario_params.strategies:
        sources.append(
            _source(base / f"gen1-{strategy}", f"gen1-{strategy}", "gen1", strategy, scenario,
                    "gen0", [splits / "new_train.parquet"], heads)
        )
    return sources


def _sequential_sources(
    params: Params, models_dir: Path, heads_dir: Path, splits_dir: Path
) -> list[GenerationSource]:
    base = models_dir / SEQUENTIAL
    splits = splits_dir / SEQUENTIAL
    heads = _heads_by_model(heads_dir / SEQUENTIAL)
    generations = len(params.sequential.fractions)
    strategies = params.sequential.strategies
    if not strategies:
        raise UserError("sequential.strategies is empty: there is no chain to register")

    gen0_dirs = [base / "gen0"] if (base / "gen0").is_dir() else [base / s / "gen0" for s in strategies]
    shared_gen0 = len(gen0_dirs) == 1 or len({_checkpoint_hash(d) for d in gen0_dirs}) == 1
    sources: list[GenerationSource] = []
    if shared_gen0:
        sources.append(_source(gen0_dirs[0], "gen0", "gen0", INITIAL_STRATEGY, SEQUENTIAL, None,
                               [splits / "gen0.parquet"], heads))
    for strategy in strategies:
        parent = "gen0"
        if not shared_gen0:
            parent = f"{strategy}/gen0"
            sources.append(_source(base / strategy / "gen0", parent, "gen0", INITIAL_STRATEGY,
                                   SEQUENTIAL, None, [splits / "gen0.parquet"], heads))
        for i in range(1, generations):
            key = f"{strategy}/gen{i}"
            sources.append(_source(base / strategy / f"gen{i}", key, f"gen{i}", strategy, SEQUENTIAL,
                                   parent, [splits / f"gen{i}.parquet"], heads))
            parent = key
    return sources


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
    if not (model_dir / CHECKPOINT_FILE).is_file():
        raise UserError(
            f"{model_dir / CHECKPOINT_FILE} does not exist: {scenario} {key} is not trained",
            hint="run the train stage for this scenario first (dvc repro)",
        )
    card = model_dir / CARD_FILE
    record = GenerationRecord(
        model_key=key,
        generation=generation,
        strategy=strategy,
        scenario=scenario,
        parent_key=parent,
        data_hash=data_hash_of([str(p) for p in data_files]),
        checkpoint_sha256=_checkpoint_hash(model_dir),
        model_card=card if card.is_file() else None,
        head_dirs=heads.get(_normalise(model_dir), {}),
    )
    return GenerationSource(record, model_dir)


def _checkpoint_hash(model_dir: Path) -> str:
    path = model_dir / CHECKPOINT_FILE
    return file_sha256(path) if path.is_file() else ""


def _normalise(path: str | Path) -> str:
    return str(Path(path).resolve())


def _heads_by_model(heads_root: Path) -> dict[str, dict[str, Path]]:
    """Head directories grouped by the model their card names as the new model."""
    grouped: dict[str, dict[str, Path]] = {}
    if not heads_root.is_dir():
        return grouped
    for card_path in sorted(heads_root.rglob(CARD_FILE)):
        card = read_json(card_path)
        new_model = ((card.get("sources") or {}).get("new_model") or {}).get("path")
        if new_model:
            name = str(card_path.parent.relative_to(heads_root))
            grouped.setdefault(_normalise(new_model), {})[name] = card_path.parent
    return grouped


def load_evidence(
    params: Params, scenario: str, metrics_dir: Path, gate_metrics: Path | None, shared_gen0: bool = True
) -> GateEvidence:
    """Gate numbers from the evaluate stage's files, overridden by an explicit JSON file."""
    metric = params.registry.gate_metric or params.evaluation.headline_metric
    evidence = GateEvidence(metric)
    if scenario == SEQUENTIAL:
        for strategy in params.sequential.strategies:
            table_path = metrics_dir / strategy / "cross_model.parquet"
            if table_path.is_file():
                evidence = evidence.merged(
                    GateEvidence.from_cross_model_table(
                        pd.read_parquet(table_path), metric, _sequential_key(strategy, shared_gen0)
                    )
                )
    else:
        table_path = metrics_dir / "cross_model.parquet"
        if table_path.is_file():
            evidence = GateEvidence.from_cross_model_table(
                pd.read_parquet(table_path), metric, degradation_pct=_degradation(metrics_dir)
            )
    if gate_metrics is not None:
        evidence = evidence.merged(GateEvidence.from_file(gate_metrics))
    return evidence


def _sequential_key(strategy: str, shared_gen0: bool) -> Callable[[str], str]:
    def key(generation: str) -> str:
        return "gen0" if generation == "gen0" and shared_gen0 else f"{strategy}/{generation}"

    return key


def _degradation(metrics_dir: Path) -> dict[str, float]:
    """Δ↓ per new model from ``summary.json``; the oracle (independent) model is the reference."""
    path = metrics_dir / "summary.json"
    if not path.is_file():
        return {}
    summary = read_json(path)
    found: dict[str, float] = {}
    if summary.get("oracle"):
        found[summary["oracle"]] = 0.0
    for rows in (summary.get("strategies") or {}).values():
        for row in rows:
            if row.get("comparison") == "self" and row.get("delta_down_pct") is not None:
                found[row["query_set"]] = float(row["delta_down_pct"])
    return found


def _default_loader() -> Callable[[Path], Any]:
    from modelupgrade.models import load_model

    return load_model


def run(
    params: Params,
    scenario: str,
    out: Path,
    *,
    models_dir: Path = Path("models"),
    heads_dir: Path = Path("heads"),
    splits_dir: Path = Path("data/splits"),
    metrics_dir: Path | None = None,
    gate_metrics: Path | None = None,
    load_model: Callable[[Path], Any] | None = None,
    tracker: Tracker | None = None,
) -> dict[str, Any]:
    """Register ``scenario``'s generations and write what happened to ``out`` (JSON)."""
    sources = scenario_sources(params, scenario, models_dir, heads_dir, splits_dir)
    if metrics_dir is None:
        metrics_dir = Path("metrics") / scenario
    shared_gen0 = not any("/" in src.record.model_key and src.record.generation == "gen0" for src in sources)
    evidence = load_evidence(params, scenario, metrics_dir, gate_metrics, shared_gen0)
    tracker = tracker or Tracker.from_params(params)
    registry = ModelRegistry(tracker, registered_model_name(params.registry.model_name, scenario))
    with tracker.stage_run(
        f"register@{scenario}",
        params={"scenario": scenario, "registry": params.registry},
        tags={"scenario": scenario},
    ) as stage:
        outcomes = register_generations(
            registry, sources, load_model or _default_loader(), evidence, params.registry.gates, stage
        )
        champion = registry.champion()
        candidate = registry.by_alias("candidate")
        summary = {
            "registered_model": registry.name,
            "tracking_uri": tracker.config.tracking_uri,
            "gate_metric": evidence.metric,
            "champion": champion.version if champion else None,
            "candidate": candidate.version if candidate else None,
            "generations": [o.as_dict() for o in outcomes],
        }
        write_json(out, summary)
        stage.log_artifact(out, "registry")
        lineage = format_lineage(registry.name, registry.versions())
        stage.log_dict({"lineage": lineage.splitlines()}, "registry/lineage.json")
    log.info("\n%s", lineage)
    return summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stages.register", description=__doc__.split("\n")[0])
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("--scenario", required=True, help="a scenario of params.yaml, or 'sequential'")
    parser.add_argument("--out", required=True, help="JSON summary of the registration")
    parser.add_argument("--models-dir", default="models", help="root of the trained models")
    parser.add_argument("--heads-dir", default="heads", help="root of the trained heads")
    parser.add_argument("--splits-dir", default="data/splits", help="root of the split files (data hash)")
    parser.add_argument(
        "--metrics-dir", help="the evaluate stage's output for this scenario (default metrics/<scenario>)"
    )
    parser.add_argument("--gate-metrics", help="explicit gate numbers (JSON), override measured ones")
    return parser


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    setup_logging()
    args = build_parser().parse_args(argv)
    params = load_params(args.params)
    run(
        params,
        args.scenario,
        Path(args.out),
        models_dir=Path(args.models_dir),
        heads_dir=Path(args.heads_dir),
        splits_dir=Path(args.splits_dir),
        metrics_dir=Path(args.metrics_dir) if args.metrics_dir else None,
        gate_metrics=Path(args.gate_metrics) if args.gate_metrics else None,
    )


if __name__ == "__main__":
    main()
