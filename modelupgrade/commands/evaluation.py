"""Cross-model evaluation of a scenario: the evaluate stages, ``modelupgrade evaluate``, and the
flows' evaluation task. The work is ``modelupgrade.evaluation.scenario``'s."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from modelupgrade.commands.results import SummaryWritten
from modelupgrade.config import Params
from modelupgrade.evaluation.summary import ScenarioEvaluation, SequentialEvaluation
from modelupgrade.layout import SEQUENTIAL, StudyLayout


class Evaluation(SummaryWritten[ScenarioEvaluation | SequentialEvaluation]):
    """An evaluation's summary (``summary.json``) and where its files went."""

    def heading(self) -> str:
        return f"{self.summary.scenario}: evaluation written to {self.metrics_dir}"


def evaluate(
    params: Params,
    scenario: str,
    root: Path = Path("."),
    strategies: Sequence[str] | None = None,
    heads: Sequence[str] | None = None,
    generations: int | None = None,
) -> Evaluation:
    """Cross-model retrieval evaluation: M(query, gallery), Δ↑, Δ↓, negative flips, heatmap.

    Two-model scenarios read <embeddings>/<sc>/gen0/ and gen1-<strategy>/ (query.npy,
    gallery.npy), labels from <splits>/<sc>/{query,gallery}.parquet, and every head
    <heads>/<sc>/<head>-<strategy>/ of the evaluated strategies (pre-computed outputs under
    <embeddings>/<sc>/<head>-<strategy>/ when present); they write <metrics>/<sc>/cross_model.*,
    summary.{json,csv} and <plots>/<sc>/cross_model_heatmap.png. The sequential scenario does the
    same per strategy under <metrics>/sequential/<strategy>/, with the compatibility-matrix metrics
    (AC with < and ≤, AM, BC, FC). Every summary holds Δ↓ against the oracle strategy
    (evaluation.oracle_strategy) when it is among the evaluated strategies.

    Args:
        params: the params file: the validated configuration of every step
        scenario: a scenario of params.yaml, or 'sequential' (the chains of sequential upgrades)
        root: the study directory: data/splits, models, embeddings, heads, metrics and plots
            below it (default: the current directory)
        strategies: strategies to evaluate (default: the scenario's strategies in params.yaml)
        heads: head directory names under <heads-root>/<sc>/ (default: every head of the
            evaluated strategies)
        generations: sequential only: evaluate the chains' gen0..gen<N-1> (default: one
            generation per snapshot of sequential.fractions)
    """
    from modelupgrade.evaluation.scenario import evaluate_scenario, report_files
    from modelupgrade.registry import track_stage

    layout = StudyLayout(root)
    asked = {
        "scenario": scenario,
        "root": layout.root,
        "strategies": strategies,
        "heads": heads,
        "generations": generations,
    }
    with track_stage("evaluate", params, run_name=f"evaluate@{scenario}", arguments=asked) as stage:
        setting = params.sequential if scenario == SEQUENTIAL else params.scenarios.get(scenario)
        stage.set_tags({"scenario": scenario})
        stage.log_params({"evaluation": params.evaluation, "scenario": setting})
        summary = evaluate_scenario(params, scenario, layout, strategies, heads, generations)
        stage.log_metrics(summary.headline_metrics())
        for folder, files in report_files(summary, layout).items():
            stage.log_artifacts(files, folder)
    return Evaluation(summary, layout.metrics(scenario))
