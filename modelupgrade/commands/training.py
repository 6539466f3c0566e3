"""Train a generation of the embedding model and embed split files with it.

``train`` is the train stages of dvc.yaml and ``modelupgrade train``; ``embed`` is ``modelupgrade
embed`` and what ``train --embed-split`` runs after training, in the same process. With
``--scenario``, every path left out is the study's (``modelupgrade.layout``): a person at the shell
writes the files ``dvc repro`` writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from modelupgrade.commands.results import SavedWithCard, WrittenFiles
from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.layout import EVALUATION_SPLITS, OLD_MODEL, StudyLayout, model_name
from modelupgrade.models.card import ModelCard

# A trained model: its directory, its card, and the embeddings written with it.
TrainedModel = SavedWithCard[ModelCard]


def train(
    params: Params,
    scenario: str | None = None,
    generation: int = 0,
    strategy: str | None = None,
    old: Path | None = None,
    split: Path | None = None,
    architecture: str | None = None,
    out: Path | None = None,
    resume_dir: Path | None = None,
    progress: bool | None = None,
    embed_split: Sequence[Path] = (),
    embed_dir: Path | None = None,
    embed_logits: bool = False,
) -> TrainedModel:
    """Train one generation of the embedding model and save it with its model card.

    With --scenario, generation 0 trains the scenario's old architecture on
    data/splits/<sc>/old_train.parquet and generation ≥ 1 its new architecture on
    new_train.parquet; --split and --architecture override either (without a scenario the default
    architecture trains on --split). An interrupted run resumes from its last finished epoch when
    started again.

    Args:
        params: the params file: the validated configuration of every step
        scenario: scenario of params.yaml: picks the training split, the architecture and the
            default --out
        generation: 0 trains the old model; 1 or more a new model under --strategy
        strategy: compatibility strategy, an entry of 'strategies' in params.yaml (from
            generation 1)
        old: the previous generation's model directory (default with --scenario and generation 1:
            models/<sc>/gen0)
        split: training split parquet; overrides the scenario's
        architecture: an entry of 'architectures' in params.yaml; overrides the scenario's
        out: model directory to write (default with --scenario: models/<sc>/gen0 or
            models/<sc>/gen<generation>-<strategy>)
        resume_dir: where epoch checkpoints go, so an interrupted run resumes (default:
            .<out name>.resume beside --out)
        progress: progress bar (default: only on a terminal)
        embed_split: after training, embed these split files with the new model (as embed does,
            in this process)
        embed_dir: directory of the --embed-split outputs: <embed-dir>/<split stem>.npy
        embed_logits: with --embed-split, also write <stem>_logits.npy (the classifier's logits)
    """
    if bool(embed_split) != (embed_dir is not None):
        raise UserError("--embed-split and --embed-dir go together", hint="give both, or neither")
    layout = StudyLayout()
    out, old = _model_paths(layout, scenario, generation, strategy, out, old)
    # The command's own arguments: what the stage's MLflow run records, and the job's inputs.
    asked: dict[str, Any] = {
        "out": out,
        "generation": generation,
        "scenario": scenario,
        "strategy": strategy,
        "old": old,
        "split": split,
        "architecture": architecture,
    }
    card = _train_tracked(params, asked, resume_dir, progress, layout)
    written: list[Path] = []
    if embed_split:
        # The pipeline embeds each model right after training it: one interpreter start, not two.
        written = embed(
            params, Path(out), split=embed_split, out_dir=embed_dir, logits=embed_logits
        ).paths
    return TrainedModel(Path(out), card, written, ("model", "embeddings"), f"trained {Path(out)}:")


def _model_paths(
    layout: StudyLayout,
    scenario: str | None,
    generation: int,
    strategy: str | None,
    out: Path | None,
    old: Path | None,
) -> tuple[Path, Path | None]:
    """The model directory to write and the previous generation's: as given, else the study's
    for ``scenario``."""
    if out is None:
        if scenario is None:
            raise UserError(
                "--out is required without --scenario", hint="pass --scenario NAME or --out DIR"
            )
        out = layout.model(scenario, model_name(generation, strategy))
    if old is None and scenario is not None and generation == 1:
        old = layout.model(scenario, OLD_MODEL)
    return out, old


def _train_tracked(
    params: Params,
    asked: Mapping[str, Any],
    resume_dir: Path | None,
    progress: bool | None,
    layout: StudyLayout,
) -> ModelCard:
    """Train inside the stage's MLflow run: the command's arguments, the seed, strategy and
    architecture, the card's headline metrics and the card itself recorded."""
    from modelupgrade.models import CARD_FILE
    from modelupgrade.registry import track_stage
    from modelupgrade.training.generation import training_arguments

    out = asked["out"]
    with track_stage("train", params, run_name=f"train@{out}", arguments=asked) as stage:
        job = training_arguments(
            params, **asked, resume_dir=resume_dir, progress=progress, layout=layout
        )
        if asked["scenario"] is not None:
            stage.set_tags({"scenario": asked["scenario"]})
        stage.log_params(
            {
                "seed": job.seed,
                "training": params.training,
                "strategy": job.strategy_params,
                "architecture": {"name": job.architecture_name, **job.architecture.model_dump()},
            }
        )
        card = job.train()
        stage.log_metrics(card.headline_metrics())
        stage.log_artifact(Path(out) / CARD_FILE, "model")
    return card


def embed(
    params: Params,
    model: Path,
    scenario: str | None = None,
    split: Sequence[Path] = (),
    out_dir: Path | None = None,
    out: Path | None = None,
    logits: bool = False,
) -> WrittenFiles:
    """Embed split files with a trained model: float32 (N, D) rows in the split files' order.

    Writes <out-dir>/<split file stem>.npy (L2-normalised) for every split; --out names the output
    of a single split instead. The images of all splits are decoded once, in one call.

    Args:
        params: the params file: the validated configuration of every step
        model: trained model directory (checkpoint.pt, card.json)
        scenario: scenario whose evaluation splits (data/splits/<sc>/query.parquet,
            gallery.parquet) are embedded by default, into embeddings/<sc>/<model directory name>/
        split: split files to embed, or plain tables of item_id and path (each an image file,
            absolute or relative to the table's folder) (default: the scenario's query and
            gallery)
        out_dir: output directory, one <split stem>.npy per split (default with --scenario:
            embeddings/<sc>/<model directory name>)
        out: output of a single --split, instead of --out-dir: a .npy matrix, or a .parquet
            vector table of item_id and embedding (what adopt, store-ingest, backfill, plan and
            cutover take)
        logits: also write <stem>_logits.npy, the classifier's logits (they order the backfill by
            old-model confidence or entropy)
    """
    from modelupgrade.registry import track_stage
    from modelupgrade.training.generation import embed_splits

    layout = StudyLayout()
    if not split and scenario is None:
        raise UserError(
            "say what to embed", hint="pass --scenario NAME (its query and gallery) or --split FILE"
        )
    if out is None and out_dir is None:
        if scenario is None:
            raise UserError(
                "say where the embeddings go",
                hint="pass --scenario NAME, --out-dir DIR or --out FILE",
            )
        out_dir = layout.embeddings(scenario, model.name)
    splits = list(split) or [layout.split_file(str(scenario), name) for name in EVALUATION_SPLITS]
    asked = {
        "model": model,
        "splits": [str(s) for s in splits],
        "out": out,
        "out_dir": out_dir,
        "logits": logits,
    }
    with track_stage("embed", params, run_name=f"embed@{model}", arguments=asked) as stage:
        stage.log_params(
            {"dataset": params.dataset, "training.eval_batch_size": params.training.eval_batch_size}
        )
        written = embed_splits(params, model, splits, out=out, out_dir=out_dir, logits=logits)
        shapes = {
            path.stem: np.load(path, mmap_mode="r").shape
            for path in written
            if path.suffix == ".npy"
        }
        stage.log_metrics(
            {
                f"{stem}.{name}": size
                for stem, shape in shapes.items()
                for name, size in zip(("rows", "dim"), shape, strict=True)
            }
        )
    return WrittenFiles(written)
