"""Cross-model evaluation of one scenario from the study's files: matrix, heatmap, Δ↑ / Δ↓ / flips.

Two-model scenarios read ``<embeddings>/<sc>/gen0/`` and ``<embeddings>/<sc>/gen1-<strategy>/``
(``query.npy``, ``gallery.npy``), labels (and, for Revisited Oxford/Paris queries, their set and
easy/hard/junk ground truth: ``modelupgrade.evaluation.revisited``) from
``<splits>/<sc>/{query,gallery}.parquet``, and every head ``<heads>/<sc>/<head>-<strategy>/`` of
the evaluated strategies: a forward head maps the old gallery (ψ(old)), a reverse head maps the new
queries (ψ_rev(new)); pre-computed outputs under ``<embeddings>/<sc>/<head>-<strategy>/`` are used
when present. Training-free adapters lie one level deeper, in a group directory without a card
(``<heads>/<sc>/adapters-<strategy>/<adapter>.<size>-<strategy>/``, outputs likewise under the
embeddings); their rows are ``forward-adapter`` / ``reverse-adapter``, apart from the trained
heads' (``modelupgrade.evaluation.head_sets``). Writes
``<metrics>/<sc>/cross_model.{parquet,csv,json}``, ``<metrics>/<sc>/summary.{json,csv}`` and
``<plots>/<sc>/cross_model_heatmap.png`` (``modelupgrade.evaluation.study_files``).

The ``sequential`` scenario (``modelupgrade.evaluation.sequential``) reads
``<embeddings>/sequential/<strategy>/gen<i>/`` for every generation (generation 0 from
``<embeddings>/sequential/gen0/`` when the chains share it) and writes the same files per strategy
under ``<metrics>/sequential/<strategy>/`` with the compatibility-matrix metrics (AC with < and ≤,
AM, BC, FC) in its summary; a run over every strategy also writes
``<metrics>/sequential/summary.json``.

Every summary holds Δ↓ (``delta_down_pct``: model → percent) against the oracle strategy
(``evaluation.oracle_strategy``) when it is evaluated: of each new model against the oracle model
in a two-model scenario, of each generation against the oracle chain's same generation in the
sequential one. The registry's gates read Δ↓ from there and nowhere else.

The directories are those of a ``StudyLayout`` (``modelupgrade.layout``). The ``evaluate`` command
(the DVC stage, the ``modelupgrade`` subcommand and the flows' task) runs ``evaluate_scenario``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from modelupgrade.config import Params
from modelupgrade.config.evaluation import ConvergenceGateParams
from modelupgrade.errors import UserError
from modelupgrade.evaluation import cross_model
from modelupgrade.evaluation.convergence import model_convergence
from modelupgrade.evaluation.head_sets import EvaluationSets, add_heads
from modelupgrade.evaluation.retrieval import RetrievalEvaluator
from modelupgrade.evaluation.sequential import evaluate_sequential
from modelupgrade.evaluation.study_files import (
    load_model_sets,
    scenario_evaluator,
    source_entry,
    write_outputs,
)
from modelupgrade.evaluation.summary import ScenarioEvaluation, SequentialEvaluation
from modelupgrade.json_data import json_value
from modelupgrade.layout import (
    CROSS_MODEL,
    GALLERY_SPLIT,
    OLD_MODEL,
    QUERY_SPLIT,
    SEQUENTIAL,
    SUMMARY,
    StudyLayout,
    new_model_name,
)
from modelupgrade.runtime import describe_device, select_device

log = logging.getLogger(__name__)

# The files of an evaluation a person reads (the parquet table is the same matrix as the CSV).
REPORT_FILES = (f"{SUMMARY}.json", f"{SUMMARY}.csv", f"{CROSS_MODEL}.csv")


def model_sets(
    layout: StudyLayout, scenario: str, strategies: Sequence[str], gate: ConvergenceGateParams
) -> EvaluationSets:
    """The old model's and each strategy's new model's query and gallery embeddings, their files'
    hashes, and the convergence of every model that recorded its fit."""
    sets = EvaluationSets()
    for model in [OLD_MODEL, *(new_model_name(s) for s in strategies)]:
        sets.queries[model], sets.galleries[model] = load_model_sets(
            layout.embeddings(scenario, model), model
        )
        sets.sources[model] = {
            split: json_value(source_entry(layout.embedding_file(scenario, model, split)))
            for split in (QUERY_SPLIT, GALLERY_SPLIT)
        }
    sets.convergence = {
        model: record
        for model in sets.queries
        if (record := model_convergence(layout.embeddings(scenario, model), gate))
    }
    return sets


def evaluation_pairs(
    params: Params,
    sets: EvaluationSets,
    comparisons: Sequence[cross_model.StrategyComparisons],
    oracle: str | None,
    adapter_sets: set[str],
) -> list[tuple[str, str]]:
    """The (query set, gallery set) pairs to measure: the essential ones of every comparison and,
    with ``evaluation.all_pairs``, every compatible pair of models and trained heads."""
    pairs = cross_model.essential_pairs(OLD_MODEL, comparisons, oracle)
    if not params.evaluation.all_pairs:
        return pairs
    # Training-free adapters (the adapter study fits many: kinds × directions × sample sizes) are
    # evaluated only where they serve, their queries against the old gallery and new queries
    # against their gallery, never in the all-pairs cross product, whose size they would square.
    return [
        *cross_model.all_compatible_pairs(
            {k: v for k, v in sets.queries.items() if k not in adapter_sets},
            {k: v for k, v in sets.galleries.items() if k not in adapter_sets},
        ),
        *pairs,
    ]


def evaluate_scenario(
    params: Params,
    scenario: str,
    layout: StudyLayout | None = None,
    strategies: Sequence[str] | None = None,
    heads: Sequence[str] | None = None,
    generations: int | None = None,
) -> ScenarioEvaluation | SequentialEvaluation:
    """Evaluate one scenario; returns the summary written to ``<metrics>/<sc>/summary.json``.

    The files are read from and written to ``layout`` (the project's by default). ``strategies``
    defaults to the scenario's in params.yaml, ``heads`` (directory names under ``<heads>/<sc>/``)
    to every head of the evaluated strategies (sequential: the chains' heads between consecutive
    generations, ``<strategy>/gen<i>/<head>``, none by default), ``generations`` (sequential only)
    to one per snapshot of ``sequential.fractions``.
    """
    layout = layout or StudyLayout()
    if scenario == SEQUENTIAL:
        return evaluate_sequential(params, layout, strategies, generations, heads or ())
    if generations is not None:
        raise UserError(
            f"{scenario} is a two-model scenario: it has no chain of generations to count",
            hint="give --generations with --scenario sequential only",
        )
    scenario_params = params.scenario(scenario)
    ev = params.evaluation
    strategies = list(strategies if strategies is not None else scenario_params.strategies)
    device = select_device(params.device)
    evaluator = scenario_evaluator(params, layout, scenario, device)
    sets = model_sets(layout, scenario, strategies, ev.convergence)
    heads_of = add_heads(sets, layout, scenario, strategies, heads, ev.convergence, device)
    # The oracle is the reference, not a candidate; it is compared only through its heads (FCT,
    # FastFill, RQT and MCL pair with the independent model), so their rows reach the summary.
    comparisons = [
        heads_of[s].comparisons(s)
        for s in strategies
        if s != ev.oracle_strategy or not heads_of[s].empty
    ]
    oracle = new_model_name(ev.oracle_strategy) if ev.oracle_strategy in strategies else None
    if oracle is None:
        log.warning("oracle strategy %r is not evaluated: Δ↓ is left empty", ev.oracle_strategy)
    adapter_sets = {a for s in strategies for a in heads_of[s].adapters}
    pairs = evaluation_pairs(params, sets, comparisons, oracle, adapter_sets)
    result = cross_model.cross_model_matrix(
        evaluator, sets.queries, sets.galleries, pairs, reference=(OLD_MODEL, OLD_MODEL)
    )
    rows, summary = scenario_summary(
        params, scenario, evaluator, device, sets, result, comparisons, oracle
    )
    write_outputs(
        result,
        rows,
        summary,
        layout.metrics(scenario),
        layout.heatmap(scenario),
        ev.heatmap_metrics,
        # The adapters' pairs are in the matrix files and the report's adapter table; in the
        # heatmap their rows and columns would be one cell each.
        [q for q in sets.queries if q not in adapter_sets],
        [g for g in sets.galleries if g not in adapter_sets],
        f"{scenario}: M(query, gallery)",
    )
    _log_summary_rows(rows)
    return summary


def scenario_summary(
    params: Params,
    scenario: str,
    evaluator: RetrievalEvaluator,
    device: Any,
    sets: EvaluationSets,
    result: Any,
    comparisons: Sequence[cross_model.StrategyComparisons],
    oracle: str | None,
) -> tuple[pd.DataFrame, ScenarioEvaluation]:
    """The summary's rows (each strategy's comparisons with M, Δ↑, Δ↓ and flips) and the summary:
    the protocol, the reference levels, Δ↓ per new model, the sources and the convergence."""
    ev = params.evaluation
    new_models = [c.new for c in comparisons] + ([oracle] if oracle else [])
    oracle_self = result.value(oracle, oracle, ev.headline_metric) if oracle else None
    degradation = (
        cross_model.delta_down(
            cross_model.self_scores(result, new_models, ev.headline_metric),
            dict.fromkeys(new_models, oracle_self),
        )
        if oracle_self is not None
        else {}
    )
    rows = cross_model.strategy_summary(
        result, OLD_MODEL, comparisons, degradation, ev.headline_metric
    )
    summary = ScenarioEvaluation(
        scenario=scenario,
        protocol={
            **evaluator.protocol_description(),
            "negative_flips": (
                f"top-{ev.flip_k} right under {OLD_MODEL}/{OLD_MODEL}, wrong under the pair; "
                "rate over all queries"
            ),
        },
        headline_metric=ev.headline_metric,
        old_model=OLD_MODEL,
        oracle=oracle,
        device=describe_device(device),
        strategies={
            s: rows[rows.strategy == s].drop(columns="strategy").to_dict(orient="records")
            for s in dict.fromkeys(rows.strategy)
        }
        if len(rows)
        else {},
        old_self=result.value(OLD_MODEL, OLD_MODEL, ev.headline_metric),
        oracle_self=oracle_self,
        # Δ↓ per model: the registry's gates read it here (``modelupgrade.registry.sources``).
        delta_down_pct=degradation,
        sources=sets.sources,
        convergence=sets.convergence,
    )
    return rows, summary


def _log_summary_rows(rows: pd.DataFrame) -> None:
    for _, row in rows.iterrows():
        log.info(
            "%s %s %s/%s: %s=%.4f Δ↑=%.2f%% Δ↓=%.2f%% NFR=%.4f",
            row.strategy,
            row.comparison,
            row.query_set,
            row.gallery_set,
            row.metric,
            row.value,
            row.delta_up_pct,
            row.delta_down_pct,
            row[cross_model.NFR_METRIC],
        )


def report_files(
    summary: ScenarioEvaluation | SequentialEvaluation, layout: StudyLayout
) -> dict[str, list[Path]]:
    """The files of an evaluation that a person reads (summaries, the matrix as CSV, the heatmaps),
    by the folder they go to among a run's artifacts: ``evaluation``, or ``evaluation/<strategy>``
    for the sequential scenario's chains."""
    scenario = summary.scenario
    parts = [None] if scenario != SEQUENTIAL else list(summary.strategies)
    return {
        "evaluation" if part is None else f"evaluation/{part}": [
            *(layout.metrics(scenario, part) / name for name in REPORT_FILES),
            layout.heatmap(scenario, part),
        ]
        for part in parts
    }
