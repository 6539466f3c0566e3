"""One generation of the embedding model: train it on its split, embed split files with it.

The ``train`` and ``embed`` commands (``modelupgrade.commands.training``: the DVC stages, the
``modelupgrade`` subcommands and the flows' tasks) run this code, so that a person without DVC gets
the files ``dvc repro`` writes, in the study's layout (``modelupgrade.layout``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from modelupgrade.config import Params
from modelupgrade.config.training import ArchitectureParams, StrategyParams, TrainingParams
from modelupgrade.errors import UserError
from modelupgrade.io import file_sha256, save_npy, write_json
from modelupgrade.layout import StudyLayout, embedding_file_name, logits_beside, training_split
from modelupgrade.runtime import select_device

if TYPE_CHECKING:
    from modelupgrade.models.card import ModelCard

log = logging.getLogger(__name__)

# The architecture a generation trains without a scenario to name one (sequential upgrades).
DEFAULT_ARCHITECTURE = "default"


def load_split_images(frame: pd.DataFrame, params: Params) -> torch.Tensor:
    """The images of a split file's rows, decoded as the dataset section says (uint8, N×C×H×W)."""
    from modelupgrade.data import load_images

    return load_images(frame, params.dataset)


def apply_cpu_threads(params: Params) -> None:
    if params.training.cpu_threads is not None:
        torch.set_num_threads(params.training.cpu_threads)


def read_split(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"split file {path} does not exist", hint="run the split stage first")
    frame = pd.read_parquet(path)
    if "label" not in frame.columns or frame.empty:
        raise UserError(
            f"{path} is empty or has no 'label' column",
            hint="pass a split file (rows of the manifest)",
        )
    return frame


def resolve_inputs(
    params: Params,
    scenario: str | None,
    generation: int,
    split: str | Path | None,
    architecture: str | None,
    layout: StudyLayout | None = None,
) -> tuple[Path, str]:
    """The training split and architecture name for this generation (a scenario's split in
    ``layout``, the project's by default)."""
    if scenario is not None:
        scenario_params = params.scenario(scenario)
        default_arch = (
            scenario_params.old_architecture
            if generation == 0
            else scenario_params.new_architecture
        )
        default_split: Path | None = (layout or StudyLayout()).split_file(
            scenario, training_split(generation)
        )
    else:
        default_arch, default_split = DEFAULT_ARCHITECTURE, None
    split_path = Path(split) if split is not None else default_split
    if split_path is None:
        raise UserError(
            "no training split given", hint="pass --scenario <name> or --split <parquet>"
        )
    arch_name = architecture or default_arch
    if arch_name not in params.architectures:
        raise UserError(
            f"unknown architecture {arch_name!r}",
            hint=f"params.yaml defines: {', '.join(params.architectures)}",
        )
    return split_path, arch_name


def training_arguments(
    params: Params,
    out: str | Path,
    generation: int,
    scenario: str | None = None,
    strategy: str | None = None,
    old: str | Path | None = None,
    split: str | Path | None = None,
    architecture: str | None = None,
    resume_dir: str | Path | None = None,
    progress: bool | None = None,
    layout: StudyLayout | None = None,
) -> TrainingJob:
    """The training of one generation (``train_model``'s arguments), its images decoded.

    Generation 0 trains the scenario's old architecture on ``old_train.parquet``, generation ≥ 1
    its new architecture on ``new_train.parquet``; ``split`` and ``architecture`` override either.
    """
    if generation < 0:
        raise UserError(f"--generation must be ≥ 0, got {generation}")
    split_path, arch_name = resolve_inputs(
        params, scenario, generation, split, architecture, layout
    )
    strategy_params = None
    if strategy is not None:
        if strategy not in params.strategies:
            raise UserError(
                f"unknown strategy {strategy!r}",
                hint=f"params.yaml defines: {', '.join(params.strategies)}",
            )
        strategy_params = params.strategies[strategy]
    apply_cpu_threads(params)
    frame = read_split(split_path)
    images = load_split_images(frame, params)
    labels = torch.tensor(frame["label"].to_numpy(dtype="int64"))
    log.info(
        "training %s on %s: %d images, %d classes",
        out,
        split_path,
        len(frame),
        labels.unique().numel(),
    )
    return TrainingJob(
        architecture=params.architectures[arch_name],
        architecture_name=arch_name,
        training=params.training,
        images=images,
        labels=labels,
        out_dir=out,
        generation=generation,
        seed=params.seed + generation,
        device=select_device(params.device),
        strategy_name=strategy,
        strategy_params=strategy_params,
        old_model_dir=old,
        data={
            "scenario": scenario,
            "split": str(split_path),
            "split_sha256": file_sha256(split_path),
        },
        resume_dir=resume_dir,
        progress=progress,
        item_ids=frame["item_id"].astype(str).tolist() if "item_id" in frame.columns else None,
    )


@dataclass(frozen=True)
class TrainingJob:
    """One generation's training: ``train_model``'s arguments, its images decoded."""

    architecture: ArchitectureParams
    architecture_name: str
    training: TrainingParams
    images: torch.Tensor
    labels: torch.Tensor
    out_dir: str | Path
    generation: int
    seed: int
    device: torch.device | str
    strategy_name: str | None
    strategy_params: StrategyParams | None
    old_model_dir: str | Path | None
    # What the model card records of the data: the scenario, the split and its hash.
    data: Mapping[str, str | None]
    resume_dir: str | Path | None
    progress: bool | None
    item_ids: list[str] | None

    def train(self) -> ModelCard:
        """Train and save the model (``training.pipeline.train_model``); returns its card."""
        from modelupgrade.training import pipeline

        return pipeline.train_model(
            architecture=self.architecture,
            architecture_name=self.architecture_name,
            training=self.training,
            images=self.images,
            labels=self.labels,
            out_dir=self.out_dir,
            generation=self.generation,
            seed=self.seed,
            device=self.device,
            strategy_name=self.strategy_name,
            strategy_params=self.strategy_params,
            old_model_dir=self.old_model_dir,
            data=self.data,
            resume_dir=self.resume_dir,
            progress=self.progress,
            item_ids=self.item_ids,
        )


def split_item_ids(frame: pd.DataFrame, split: str | Path) -> list[str]:
    """The item ids of a split file's rows (what an embeddings-only model looks vectors up by)."""
    if "item_id" not in frame.columns:
        raise UserError(
            f"{split} has no item_id column, so its vectors cannot be looked up",
            hint="pass a split file (rows of the manifest)",
        )
    return frame["item_id"].astype(str).tolist()


def embedding_targets(
    splits: Sequence[str | Path], out: str | Path | None, out_dir: str | Path | None
) -> list[Path]:
    """The file each split's embeddings go to: ``out`` (one split; a ``.parquet`` one is the vector
    table of item_id and embedding) or ``<out_dir>/<stem>.npy``."""
    if (out is None) == (out_dir is None):
        raise UserError("pass exactly one of --out (one split) and --out-dir")
    if out is not None:
        if len(splits) != 1:
            raise UserError(
                f"--out names one file but {len(splits)} splits were given", hint="use --out-dir"
            )
        return [Path(out)]
    stems = [Path(s).stem for s in splits]
    if len(set(stems)) != len(stems):
        raise UserError(
            f"split files share a name ({', '.join(stems)}); their outputs would collide"
        )
    assert out_dir is not None  # exactly one of out and out_dir, checked above
    return [Path(out_dir) / embedding_file_name(stem) for stem in stems]


def embed_splits(
    params: Params,
    model_dir: str | Path,
    splits: Sequence[str | Path],
    out: str | Path | None = None,
    out_dir: str | Path | None = None,
    logits: bool = False,
) -> list[Path]:
    """Embed every split with the model (images decoded once, in one call);
    returns the written paths.

    ``logits`` also writes ``<stem>_logits.npy`` beside each output: the model's classifier logits
    on its embeddings, which order the backfill by old-model confidence or entropy.
    """
    from modelupgrade.data.image_table import read_image_rows
    from modelupgrade.data.vector_table import write_vector_table
    from modelupgrade.models import (
        classifier_logits,
        embed,
        load_model,
        read_model_card,
        runs_on_images,
    )
    from modelupgrade.training.convergence import FIT_FILE

    if not splits:
        raise UserError("no split given", hint="pass --split <parquet> [...]")
    targets = embedding_targets(splits, out, out_dir)
    device = select_device(params.device)
    apply_cpu_threads(params)
    model = load_model(model_dir, device)
    frames = [read_image_rows(s, "split") for s in splits]
    if runs_on_images(model):
        images = load_split_images(pd.concat(frames, ignore_index=True), params)
        embeddings = embed(model, images, params.training.eval_batch_size, device)
    else:
        # An embeddings-only model gives the vectors it holds for the splits' items (it is a
        # PrecomputedEmbeddings, whose lookup the EmbeddingModel type does not declare).
        embeddings = np.concatenate(
            [
                model.lookup(split_item_ids(frame, split), Path(split).stem).cpu().numpy()  # type: ignore[operator]
                for frame, split in zip(frames, splits, strict=True)
            ]
        )
    written = list(targets)
    fit = read_model_card(model_dir).fit
    if fit is not None:
        # Beside the embeddings, the evaluation reads whether the model trained without loading it.
        fit_path = targets[0].parent / FIT_FILE
        write_json(fit_path, fit)
        written.append(fit_path)
    start = 0
    for frame, target, split in zip(frames, targets, splits, strict=True):
        part = np.ascontiguousarray(embeddings[start : start + len(frame)])
        start += len(frame)
        if target.suffix == ".parquet":
            write_vector_table(target, split_item_ids(frame, split), part)
        else:
            save_npy(target, part)
        log.info("embedded %s with %s: %s → %s", split, model_dir, part.shape, target)
        if logits:
            logits_path = logits_beside(target)
            save_npy(logits_path, classifier_logits(model, part))
            written.append(logits_path)
    return written
