"""``modelupgrade train | embed | evaluate | simulate-backfill``: the study without DVC.

Each command runs the library code that the pipeline stage of the same name runs, reads the same
params.yaml and writes the same files in the same layout (``models/<scenario>/gen0``,
``embeddings/<scenario>/<model>/``, ``metrics/<scenario>/``, ``plots/<scenario>/``), so that
``dvc repro`` and a person at the shell can take over from each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from modelupgrade.errors import UserError, exit_on_user_error

ParamsOption = Annotated[
    Path, typer.Option("--params", help="params file: the validated configuration of every step")
]


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
    app.command("embed")(embed_command)
    app.command("evaluate")(evaluate_command)
    app.command("simulate-backfill")(simulate_backfill_command)


def _echo_metrics(metrics: dict[str, float]) -> None:
    width = max((len(name) for name in metrics), default=0)
    for name, value in metrics.items():
        typer.echo(f"  {name:<{width}}  {value:.4g}")


@exit_on_user_error
def train_command(
    scenario: Annotated[
        str | None,
        typer.Option(help="scenario of params.yaml: picks the training split (data/splits/<sc>/old_train.parquet "
                          "for generation 0, new_train.parquet after), the architecture and the default --out"),
    ] = None,
    generation: Annotated[
        int, typer.Option(help="0 trains the old model; 1 or more a new model under --strategy")
    ] = 0,
    strategy: Annotated[
        str | None,
        typer.Option(help="compatibility strategy, an entry of 'strategies' in params.yaml (from generation 1)"),
    ] = None,
    old: Annotated[
        Path | None,
        typer.Option(help="the previous generation's model directory (default with --scenario and generation 1: "
                          "models/<sc>/gen0)"),
    ] = None,
    split: Annotated[Path | None, typer.Option(help="training split parquet; overrides the scenario's")] = None,
    architecture: Annotated[
        str | None, typer.Option(help="an entry of 'architectures' in params.yaml; overrides the scenario's")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="model directory to write (default with --scenario: models/<sc>/gen0 or "
                          "models/<sc>/gen<generation>-<strategy>)"),
    ] = None,
    resume_dir: Annotated[
        Path | None,
        typer.Option(help="where epoch checkpoints go, so an interrupted run resumes (default: .<out name>.resume "
                          "beside --out)"),
    ] = None,
    progress: Annotated[
        bool | None, typer.Option("--progress/--no-progress", help="progress bar (default: only on a terminal)")
    ] = None,
    params_path: ParamsOption = Path("params.yaml"),
) -> None:
    """Train one generation of the embedding model and save it with its model card."""
    from modelupgrade.plugins import load_params
    from modelupgrade.training.generation import MODELS_DIR, model_name, train_generation, training_metrics

    params = load_params(params_path)
    if out is None:
        if scenario is None:
            raise UserError("--out is required without --scenario", hint="pass --scenario NAME or --out DIR")
        out = MODELS_DIR / scenario / model_name(generation, strategy)
    if old is None and scenario is not None and generation == 1:
        old = MODELS_DIR / scenario / model_name(0, None)
    card = train_generation(
        params, out, generation, scenario=scenario, strategy=strategy, old=old, split=split,
        architecture=architecture, resume_dir=resume_dir, progress=progress,
    )
    typer.echo(f"trained {out}:")
    _echo_metrics(training_metrics(card))


@exit_on_user_error
def embed_command(
    model: Annotated[Path, typer.Option(help="trained model directory (checkpoint.pt, card.json)")],
    scenario: Annotated[
        str | None,
        typer.Option(help="scenario whose evaluation splits (data/splits/<sc>/query.parquet, gallery.parquet) "
                          "are embedded by default, into embeddings/<sc>/<model directory name>/"),
    ] = None,
    split: Annotated[
        list[Path] | None,
        typer.Option(help="a split parquet to embed (repeatable; default: the scenario's query and gallery)"),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(help="output directory, one <split stem>.npy per split (default with --scenario: "
                          "embeddings/<sc>/<model directory name>)"),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="output .npy of a single --split, instead of --out-dir")] = None,
    logits: Annotated[
        bool,
        typer.Option("--logits", help="also write <stem>_logits.npy, the classifier's logits (they order the "
                                      "backfill by old-model confidence or entropy)"),
    ] = False,
    params_path: ParamsOption = Path("params.yaml"),
) -> None:
    """Embed split files with a trained model: float32 (N, D) rows in the split files' order."""
    from modelupgrade.plugins import load_params
    from modelupgrade.training.generation import EMBEDDINGS_DIR, EVALUATION_SPLITS, SPLITS_DIR, embed_splits

    params = load_params(params_path)
    if not split and scenario is None:
        raise UserError("say what to embed", hint="pass --scenario NAME (its query and gallery) or --split FILE")
    if out is None and out_dir is None:
        if scenario is None:
            raise UserError("say where the embeddings go", hint="pass --scenario NAME, --out-dir DIR or --out FILE")
        out_dir = EMBEDDINGS_DIR / scenario / model.name
    splits = split or [SPLITS_DIR / str(scenario) / f"{name}.parquet" for name in EVALUATION_SPLITS]
    for path in embed_splits(params, model, splits, out=out, out_dir=out_dir, logits=logits):
        typer.echo(f"wrote {path}")


@exit_on_user_error
def evaluate_command(
    scenario: Annotated[
        str, typer.Option(help="a scenario of params.yaml, or 'sequential' (the chains of sequential upgrades)")
    ],
    embeddings_root: Annotated[
        Path, typer.Option(help="root of <sc>/<model>/{query,gallery}.npy (gen0, gen1-<strategy>, head outputs)")
    ] = Path("embeddings"),
    splits_root: Annotated[
        Path, typer.Option(help="root of <sc>/{query,gallery}.parquet, whose labels the metrics use")
    ] = Path("data/splits"),
    heads_root: Annotated[Path, typer.Option(help="root of <sc>/<head>-<strategy>/ head directories")] = Path("heads"),
    metrics_root: Annotated[
        Path, typer.Option(help="tables go to <root>/<sc>/: cross_model.{parquet,csv,json}, summary.{json,csv}")
    ] = Path("metrics"),
    plots_root: Annotated[Path, typer.Option(help="the heatmap goes to <root>/<sc>/cross_model_heatmap.png")] = Path(
        "plots"
    ),
    strategy: Annotated[
        list[str] | None,
        typer.Option(help="a strategy to evaluate (repeatable; default: the scenario's strategies in params.yaml)"),
    ] = None,
    head: Annotated[
        list[str] | None,
        typer.Option(help="a head directory name under <heads-root>/<sc>/ (repeatable; default: every head of "
                          "the evaluated strategies)"),
    ] = None,
    params_path: ParamsOption = Path("params.yaml"),
) -> None:
    """Cross-model retrieval evaluation: M(query model, gallery model), Δ↑, Δ↓, negative flips, heatmap."""
    from modelupgrade.evaluation.scenario import evaluate_scenario, metrics_dir, summary_metrics
    from modelupgrade.plugins import load_params

    params = load_params(params_path)
    summary = evaluate_scenario(params, scenario, embeddings_root, splits_root, heads_root, metrics_root,
                                plots_root, strategy or None, head or None)
    typer.echo(f"{scenario}: evaluation written to {metrics_dir(metrics_root, scenario)}")
    _echo_metrics(summary_metrics(summary))


@exit_on_user_error
def simulate_backfill_command(
    scenario: Annotated[str, typer.Option(help="a scenario of params.yaml")],
    embeddings_root: Annotated[
        Path | None,
        typer.Option(help="compare every strategy and head of the scenario found under <root>/<sc>/ (gen0, "
                          "gen1-<strategy>, <head>-<strategy>); default: embeddings, unless --old is given"),
    ] = None,
    old: Annotated[
        Path | None, typer.Option(help="the old model's embedding directory (query.npy, gallery.npy)")
    ] = None,
    variant: Annotated[
        list[str] | None,
        typer.Option(metavar="NAME=DIR", help="with --old: an upgraded system, its name and its new model's "
                                              "embedding directory (repeatable)"),
    ] = None,
    array: Annotated[
        list[str] | None,
        typer.Option(metavar="NAME:FIELD=PATH", help="with --old: a head output of a variant; FIELD is "
                     "forward_gallery, sigma2, reverse_query, rho_query, rho_gallery or rho_reverse_query "
                     "(repeatable)"),
    ] = None,
    old_logits: Annotated[
        Path | None,
        typer.Option(help="with --old: the old classifier's logits on the gallery split (.npy), for the "
                          "confidence and entropy orders"),
    ] = None,
    query_split: Annotated[
        Path | None, typer.Option(help="query split parquet (default: data/splits/<sc>/query.parquet)")
    ] = None,
    gallery_split: Annotated[
        Path | None, typer.Option(help="gallery split parquet (default: data/splits/<sc>/gallery.parquet)")
    ] = None,
    metrics_dir: Annotated[
        Path | None,
        typer.Option(help="where backfill_curves.{parquet,csv}, backfill_summary.json and backfill_plots/ go "
                          "(default: metrics/<sc>)"),
    ] = None,
    plots_dir: Annotated[
        Path | None, typer.Option(help="where backfill_curves.png goes (default: plots/<sc>)")
    ] = None,
    params_path: ParamsOption = Path("params.yaml"),
) -> None:
    """Simulate online backfilling: retrieval quality while the gallery moves to the new model."""
    from modelupgrade.backfill.study import backfill_inputs, output_dirs, simulate_backfill, summary_metrics
    from modelupgrade.plugins import load_params

    params = load_params(params_path)
    root = embeddings_root if embeddings_root is not None or old is not None else Path("embeddings")
    found = backfill_inputs(params, scenario, root, old, variant or (), array or (), old_logits)
    summary = simulate_backfill(params, scenario, found.old, found.variants, found.arrays, found.old_logits,
                                query_split, gallery_split, metrics_dir, plots_dir)
    typer.echo(f"{scenario}: {len(summary['curves'])} backfill curves written to "
               f"{output_dirs(scenario, metrics_dir, plots_dir)[0]} ({len(summary['skipped'])} skipped)")
    _echo_metrics(summary_metrics(summary))
