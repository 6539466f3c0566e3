"""Train one generation end to end: build the model, pick the strategy, fit, save with its card."""

from __future__ import annotations

import importlib.metadata
import logging
import platform
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from modelupgrade.config.training import ArchitectureParams, StrategyParams, TrainingParams
from modelupgrade.errors import UserError
from modelupgrade.io import file_sha256
from modelupgrade.json_data import JsonObject, json_value
from modelupgrade.models import (
    CARD_FILE,
    EmbeddingModel,
    load_model,
    read_model_card,
    runs_on_images,
    save_model,
)
from modelupgrade.models.card import ModelCard
from modelupgrade.models.weights_file import load_pretrained_backbone
from modelupgrade.runtime import describe_device, seed_everything
from modelupgrade.strategies import CompatibilityStrategy, Independent, build_strategy
from modelupgrade.training.convergence import TrainingFit, fit_of_trained_model
from modelupgrade.training.engine import Trainer, TrainingResult

log = logging.getLogger(__name__)


def default_resume_dir(out_dir: str | Path) -> Path:
    """Where epoch checkpoints of an unfinished run live: a hidden sibling of
    the output directory."""
    out_dir = Path(out_dir)
    return out_dir.parent / f".{out_dir.name}.resume"


def build_model(
    architecture: ArchitectureParams, images: torch.Tensor, labels: torch.Tensor
) -> EmbeddingModel:
    """A fresh model sized for this training set (channels, image size, classes 0..max label),
    its backbone loaded from the architecture's ``pretrained`` file when it names one."""
    num_classes = int(labels.max()) + 1
    model = EmbeddingModel(
        architecture, in_chans=images.shape[1], num_classes=num_classes, input_size=images.shape[-1]
    )
    model.trained_classes = sorted(int(c) for c in torch.unique(labels).tolist())
    if architecture.pretrained is not None:
        model.initialised_from = load_pretrained_backbone(
            model.backbone,
            architecture.pretrained.path,
            architecture.pretrained.sha256,
            architecture.backbone,
        )
    return model


def train_model(
    *,
    architecture: ArchitectureParams,
    architecture_name: str,
    training: TrainingParams,
    images: torch.Tensor,
    labels: torch.Tensor,
    out_dir: str | Path,
    generation: int,
    seed: int,
    device: torch.device | str = "cpu",
    strategy_name: str | None = None,
    strategy_params: StrategyParams | None = None,
    old_model_dir: str | Path | None = None,
    data: Mapping[str, Any] | None = None,
    resume_dir: str | Path | None = None,
    progress: bool | None = None,
    item_ids: Sequence[str] | None = None,
) -> ModelCard:
    """Train and save one model; returns its card. Generation 0 trains without a strategy.

    ``item_ids`` name the training images: an embeddings-only old model (adopted vectors) gives
    their old embeddings by id.

    Under torchrun every process trains; rank 0 alone saves, and the others
    return the card it wrote.
    """
    device = torch.device(device)
    strategy = generation_strategy(generation, strategy_name, strategy_params, old_model_dir)
    old_model = required_old_model(strategy, strategy_name, old_model_dir)
    parent = parent_entry(old_model_dir)
    seed_everything(seed)  # the initial weights depend on the seed only
    model = build_model(architecture, images, labels)
    old_training_features = None
    if old_model is not None:
        strategy.check_models(model, old_model)
        old_training_features = looked_up_old_features(old_model, old_model_dir, item_ids, data)
    resume_dir = Path(resume_dir) if resume_dir is not None else default_resume_dir(out_dir)
    name = Path(out_dir).name if strategy_name is None else f"gen{generation}-{strategy_name}"
    trainer = Trainer(
        training,
        device=device,
        seed=seed,
        resume_dir=resume_dir,
        progress=progress,
        description=name,
    )
    result = trainer.fit(model, images, labels, strategy, old_model, old_training_features)
    # Measured on the training images, without augmentation: did this model train at all?
    fit = fit_of_trained_model(model, images, labels, result.history)
    card_fields = {
        "generation": generation,
        "architecture_name": architecture_name,
        "strategy": {"name": strategy_name or "independent", **strategy.describe()},
        "parent": parent,
        "seed": seed,
        "data": {
            **(data or {}),
            "images": int(images.shape[0]),
            "classes": len(model.trained_classes or []),
        },
        "training": training.model_dump(mode="json"),
        **run_entries(result, fit, device),
        **strategy.card_entries(),
    }
    if model.initialised_from is not None:
        card_fields["initialised_from"] = model.initialised_from
    return save_on_primary(model, out_dir, card_fields, strategy, result, resume_dir)


def required_old_model(
    strategy: CompatibilityStrategy, strategy_name: str | None, old_model_dir: str | Path | None
) -> EmbeddingModel | None:
    """The previous generation's model, loaded when ``strategy`` trains against it."""
    if not strategy.needs_old_model:
        return None
    if old_model_dir is None:
        raise UserError(
            f"strategy {strategy_name!r} needs the previous generation",
            hint="pass --old <model dir>",
        )
    return load_model(old_model_dir)


def save_on_primary(
    model: EmbeddingModel,
    out_dir: str | Path,
    card_fields: Mapping[str, Any],
    strategy: CompatibilityStrategy,
    result: TrainingResult,
    resume_dir: Path,
) -> ModelCard:
    """Save the trained model with its card on the primary process (rank 0 under torchrun) and
    drop its epoch checkpoints; every process returns that card."""
    # Imported here: torch.distributed loads only when a model is trained.
    from modelupgrade.training.distributed import current as current_process_group

    data_parallel = current_process_group()
    if data_parallel.is_primary:
        card = save_model(model.cpu(), out_dir, card_fields, extra_weights=strategy.artifacts())
        shutil.rmtree(resume_dir, ignore_errors=True)
        log.info(
            "saved %s (%.1f s, %.0f images/s)", out_dir, result.seconds, result.images_per_second
        )
    data_parallel.barrier()
    return card if data_parallel.is_primary else read_model_card(out_dir)


def generation_strategy(
    generation: int,
    strategy_name: str | None,
    strategy_params: StrategyParams | None,
    old_model_dir: str | Path | None,
) -> CompatibilityStrategy:
    """Generation 0's independent training (without a strategy or an old model), or a later
    generation's configured strategy."""
    if generation == 0:
        if strategy_name is not None or old_model_dir is not None:
            raise UserError(
                "generation 0 is trained without a strategy or an old model",
                hint="drop --strategy/--old",
            )
        return Independent()
    if strategy_params is None or strategy_name is None:
        raise UserError(
            f"generation {generation} needs a strategy",
            hint="pass --strategy <name from params.yaml>",
        )
    return build_strategy(strategy_params.kind, strategy_params.options)


def parent_entry(old_model_dir: str | Path | None) -> dict[str, str] | None:
    """The previous generation as the card records it: its directory and its card's hash."""
    if old_model_dir is None:
        return None
    parent_card = Path(old_model_dir) / CARD_FILE
    if not parent_card.is_file():
        raise UserError(f"{parent_card} does not exist", hint="train the previous generation first")
    return {"path": str(old_model_dir), "card_sha256": file_sha256(parent_card)}


def looked_up_old_features(
    old_model: EmbeddingModel,
    old_model_dir: str | Path | None,
    item_ids: Sequence[str] | None,
    data: Mapping[str, Any] | None,
) -> torch.Tensor | None:
    """An embeddings-only old model's vectors of the training images, looked up by item id; None
    for an old model that runs on images (the strategy runs it)."""
    if runs_on_images(old_model):
        return None
    if item_ids is None:
        raise UserError(
            f"{old_model_dir} is embeddings-only: its vectors are looked up by item id, "
            "and these training images come without ids",
            hint="train from a split file (--scenario or --split), whose rows name items",
        )
    split = str((data or {}).get("split") or "the training split")
    # An embeddings-only model is a PrecomputedEmbeddings: the type does not say lookup.
    features: torch.Tensor = old_model.lookup(list(item_ids), split)  # type: ignore[operator]
    return features


def run_entries(result: TrainingResult, fit: TrainingFit, device: torch.device) -> JsonObject:
    """How the run went, as the card records it: the history and fit, its time and speed, where
    it resumed, the device and processes, the library versions."""
    return {
        "history": json_value(result.history),
        "fit": json_value(fit.as_dict()),
        "train_seconds": round(result.seconds, 3),
        "train_images_per_second": round(result.images_per_second, 1),
        "resumed_from_epoch": result.resumed_from_epoch,
        "device": describe_device(device),
        "training_processes": result.world_size,
        "versions": {
            "torch": torch.__version__,
            "timm": importlib.metadata.version("timm"),
            "python": platform.python_version(),
        },
    }
