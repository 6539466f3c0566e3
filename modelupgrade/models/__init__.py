"""Embedding models: build, save, load and embed; adopt models made elsewhere."""

from modelupgrade.models.adopted import MODEL_SOURCES, adopt_model, runs_on_images
from modelupgrade.models.backbone import apply_cifar_stem, create_backbone
from modelupgrade.models.embedding import EmbeddingModel
from modelupgrade.models.inference import autocast_for, classifier_logits, embed, embed_tensor
from modelupgrade.models.persistence import (
    CARD_FILE,
    CARD_FORMAT,
    WEIGHTS_FILE,
    build_from_card,
    cpu_state,
    load_model,
    model_description,
    read_model_card,
    save_model,
)

__all__ = [
    "CARD_FILE",
    "CARD_FORMAT",
    "MODEL_SOURCES",
    "WEIGHTS_FILE",
    "EmbeddingModel",
    "adopt_model",
    "apply_cifar_stem",
    "autocast_for",
    "build_from_card",
    "classifier_logits",
    "cpu_state",
    "create_backbone",
    "embed",
    "embed_tensor",
    "load_model",
    "model_description",
    "read_model_card",
    "runs_on_images",
    "save_model",
]
