"""Saving and loading embedding models: ``<dir>/checkpoint.pt`` (state dict) and
``<dir>/card.json``.

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

from modelupgrade.cards import CARD_FILE, load_weights, read_card, save_card_directory
from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject, json_value
from modelupgrade.models.card import MODEL_WEIGHTS_FILE, ModelCard
from modelupgrade.models.embedding import EmbeddingModel

CARD_FORMAT = ModelCard.FORMAT
WEIGHTS_FILE = MODEL_WEIGHTS_FILE

__all__ = [
    "CARD_FILE",
    "CARD_FORMAT",
    "WEIGHTS_FILE",
    "build_from_card",
    "cpu_state",
    "load_model",
    "model_description",
    "read_model_card",
    "save_model",
]


def model_description(model: EmbeddingModel) -> JsonObject:
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
        "trained_classes": json_value(model.trained_classes),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def cpu_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().cpu().clone() for name, tensor in module.state_dict().items()}


def save_model(
    model: EmbeddingModel,
    out_dir: str | Path,
    card_fields: Mapping[str, Any],
    extra_weights: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
) -> ModelCard:
    """Write checkpoint.pt, card.json and any ``extra_weights`` files into
    ``out_dir`` atomically."""
    weights = {WEIGHTS_FILE: cpu_state(model), **(extra_weights or {})}
    return save_card_directory(
        out_dir,
        weights,
        lambda hashes: ModelCard.model_validate(
            {**model_description(model), **card_fields, "weights_sha256": hashes}
        ),
    )


def read_model_card(model_dir: str | Path) -> ModelCard:
    return read_card(model_dir, ModelCard)


def build_from_card(card: ModelCard) -> EmbeddingModel:
    if card.architecture is None or card.in_chans is None or card.input_size is None:
        raise UserError(
            "an adopted model is rebuilt by its source, not from an architecture",
            hint="load it with load_model",
        )
    return EmbeddingModel(
        card.architecture,
        in_chans=card.in_chans,
        num_classes=card.num_classes,
        input_size=card.input_size,
    )


def load_model(model_dir: str | Path, device: torch.device | str = "cpu") -> EmbeddingModel:
    """Rebuild the model saved in ``model_dir`` from its card, load its
    checked weights, eval mode. An adopted model (``modelupgrade adopt``) comes back as the
    module its source builds, with the same interface."""
    card = read_model_card(model_dir)
    if card.adopted is not None:
        from modelupgrade.models.adopted import load_adopted

        adopted = load_adopted(model_dir, card)
        # An adopted module has EmbeddingModel's interface (embedding_dim, classifier, card,
        # forward) without being one: the types see a plain module.
        adopted.card = card  # type: ignore[assignment]
        return adopted.to(device).eval()  # type: ignore[return-value]
    model = build_from_card(card)
    try:
        model.load_state_dict(load_weights(model_dir, card))
    except RuntimeError as err:
        raise UserError(
            f"{Path(model_dir) / WEIGHTS_FILE} does not match its card: {err}"
        ) from None
    model.trained_classes = card.trained_classes
    model.card = card
    return model.to(device).eval()
