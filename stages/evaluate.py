"""Stage: cross-model retrieval evaluation of one scenario (matrix, heatmap, Δ↑ / Δ↓ / flips).

    python -m stages.evaluate --params params.yaml --scenario extended-data \
        --embeddings-root embeddings --splits-root data/splits --heads-root heads \
        --metrics-root metrics --plots-root plots

Two-model scenarios read ``embeddings/<sc>/gen0/`` and ``embeddings/<sc>/gen1-<strategy>/``
(``query.npy``, ``gallery.npy``), labels from ``data/splits/<sc>/{query,gallery}.parquet``, and every
head ``heads/<sc>/<head>-<strategy>/`` of the evaluated strategies: a forward head maps the old
gallery (ψ(old)), a reverse head maps the new queries (ψ_rev(new)); pre-computed outputs under
``embeddings/<sc>/<head>-<strategy>/`` are used when present. Writes
``metrics/<sc>/cross_model.{parquet,csv,json}``, ``metrics/<sc>/summary.{json,csv}`` and
``plots/<sc>/cross_model_heatmap.png``.

The ``sequential`` scenario reads ``embeddings/sequential/<strategy>/gen<i>/`` for every generation
(generation 0 from ``embeddings/sequential/gen0/`` when the chains share it) and writes the same
files per strategy under ``metrics/sequential/<strategy>/`` with the compatibility-matrix metrics
(AC with < and ≤, AM, BC, FC) in its summary; a run over every strategy also writes
``metrics/sequential/summary.json``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from modelupgrade.config import Params
from modelupgrade.errors import exit_on_user_error
from modelupgrade.evaluation.scenario import SEQUENTIAL, evaluate_scenario, report_files, summary_metrics
from modelupgrade.plugins import load_params
from modelupgrade.registry import track_stage
from modelupgrade.runtime import setup_logging


def run(
    params: Params,
    scenario: str,
    embeddings_root: str | Path = "embeddings",
    splits_root: str | Path = "data/splits",
    heads_root: str | Path = "heads",
    metrics_root: str | Path = "metrics",
    plots_root: str | Path = "plots",
    strategies: Sequence[str] | None = None,
    heads: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Evaluate one scenario; returns the summary written to ``metrics/<sc>/summary.json``."""
    asked = {"scenario": scenario, "embeddings_root": embeddings_root, "splits_root": splits_root,
             "heads_root": heads_root, "strategies": strategies, "heads": heads}
    with track_stage("evaluate", params, run_name=f"evaluate@{scenario}", arguments=asked) as stage:
        setting = params.sequential if scenario == SEQUENTIAL else params.scenarios.get(scenario)
        stage.set_tags({"scenario": scenario})
        stage.log_params({"evaluation": params.evaluation, "scenario": setting})
        summary = evaluate_scenario(params, scenario, embeddings_root, splits_root, heads_root, metrics_root,
                                    plots_root, strategies, heads)
        stage.log_metrics(summary_metrics(summary))
        for folder, files in report_files(summary, metrics_root, plots_root).items():
            stage.log_artifacts(files, folder)
    return summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stages.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("--scenario", required=True, help="a scenario of params.yaml, or 'sequential'")
    parser.add_argument("--embeddings-root", default="embeddings", help="root of <sc>/<model>/{query,gallery}.npy")
    parser.add_argument("--splits-root", default="data/splits", help="root of <sc>/{query,gallery}.parquet")
    parser.add_argument("--heads-root", default="heads", help="root of <sc>/<head>-<strategy>/ head directories")
    parser.add_argument("--metrics-root", default="metrics", help="metrics are written to <root>/<sc>/")
    parser.add_argument("--plots-root", default="plots", help="plots are written to <root>/<sc>/")
    parser.add_argument("--strategies", nargs="*", default=None,
                        help="strategies to evaluate (default: the scenario's strategies in params.yaml)")
    parser.add_argument("--heads", nargs="*", default=None,
                        help="head directory names under heads/<sc>/ (default: all of the evaluated strategies)")
    return parser


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    setup_logging()
    run(load_params(args.params), args.scenario, args.embeddings_root, args.splits_root, args.heads_root,
        args.metrics_root, args.plots_root, args.strategies, args.heads)


if __name__ == "__main__":
    main()
