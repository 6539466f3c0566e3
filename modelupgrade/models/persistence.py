"""Saving and loading embedding models: ``<dir>/checkpoint.pt`` (state dict) and ``<dir>/card.json``.

The card says what the model is (architecture, input channels and size, embedding dimension,
classifier, classes it was trained on), how it was trained (strategy and its options, training
hyper-parameters, seed, loss history, device, throughput) and from what (training split with its
hash, parent model with its card hash). ``load_model`` rebuilds the network from the card alone and
loads the weights with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from modelupgrade.config.training import ArchitectureParams
from modelupgrade.errors import UserError
from modelupgrade.io import atomic_path, file_sha256, read_json, write_json
from modelupgrade.models.embedding import EmbeddingModel

CARD_FORMAT = "modelupgrade-model/1"
WEIGHTS_FILE = "checkpoint.pt"
CARD_FILE = "card.json"


def model_description(model: EmbeddingModel) -> dict[str, Any]:
    """The part of the card that ``load_model`` needs to rebuild the network."""
    return {
        "format": CARD_FORMAT,
        "architecture": model.architecture.model_dump(mode="json"),
        "in_chans": model.in_chans,
        "input_size": model.input_size,
        "embedding_dim": model.embedding_dim,
        "num_classes": model.num_classes,
        "classifier": {
            "kind": model.architecture.classifier,
            "scale": model.classifier.scale,
            "margin": model.classifier.margin,
        },
        "trained_classes": model.trained_classes,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def cpu_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().cpu().clone() for name, tensor in module.state_dict().items()}


def save_model(
    model: EmbeddingModel,
    out_dir: str | Path,
    card_fields: Mapping[str, Any],
    extra_weights: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
) -> dict[str, Any]:
    """Write checkpoint.pt, card.json and any ``extra_weights`` files into ``out_dir`` atomically."""
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        torch.save(cpu_state(model), tmp / WEIGHTS_FILE)
        hashes = {WEIGHTS_FILE: file_sha256(tmp / WEIGHTS_FILE)}
        for file_name, state in (extra_weights or {}).items():
            torch.save(dict(state), tmp / file_name)
            hashes[file_name] = file_sha256(tmp / file_name)
        card = {**model_description(model), **card_fields, "weights_sha256": hashes}
        write_json(tmp / CARD_FILE, card)
    return card


def read_model_card(model_dir: str | Path) -> dict[str, Any]:
    card_path = Path(model_dir) / CARD_FILE
    if not card_path.is_file():
        raise UserError(f"{card_path} does not exist", hint="train the model first (stage train)")
    card = read_json(card_path)
    if card.get("format") != CARD_FORMAT:
        raise UserError(f"{card_path} is not a model card (format {card.get('format')!r}, expected {CARD_FORMAT!r})")
    return card


def build_from_card(card: Mapping[str, Any]) -> EmbeddingModel:
    return EmbeddingModel(
        ArchitectureParams.model_validate(card["architecture"]),
        in_chans=int(card["in_chans"]), num_classes=int(card["num_classes"]),
        input_size=int(card["input_size"]),
    )


def load_model(model_dir: str | Path, device: torch.device | str = "cpu") -> EmbeddingModel:
    """Rebuild the model saved in ``model_dir`` from its card, load its weights, eval mode."""
    model_dir = Path(model_dir)
    card = read_model_card(model_dir)
    model = build_from_card(card)
    weights = model_dir / WEIGHTS_FILE
    if not weights.is_file():
        raise UserError(f"{weights} does not exist", hint="the model directory is incomplete; retrain it")
    state = torch.load(weights, map_location="cpu", weights_only=True)
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise UserError(f"{weights} does not match its card: {err}") from None
    model.trained_classes = card.get("trained_classes")
    model.card = card  # type: ignore[assignment]
    return model.to(device).eval()
