"""What the registry records of a generation beyond its lineage: how its model is logged, where an
adopted model came from, and what each head logged beside it is.

A model is logged in the form a consumer can load without surprises:

- a model trained here, or adopted from a timm or torchvision state dict, is an eager module of
  importable classes: the ``mlflow.pytorch`` flavour (pickle), ``mlflow.pytorch.load_model``;
- an adopted TorchScript model or torch.export program wraps compiled foreign code that pickle
  cannot carry: its model directory (card.json, checkpoint.pt, network.torchscript or
  network.pt2) is logged as files, and
  ``ModelRegistry.load_model`` rebuilds it with modelupgrade;
- an embeddings-only model cannot run at all: its card and a record of its vectors' checksums are
  logged (not the vectors: a production gallery's table is millions of rows, and the model
  directory it was registered from holds them, hashed). It cannot be loaded as a pytorch model.

The form is the ``logged_as`` version tag; an adopted model's provenance (its card's ``adopted``
entry) the ``adopted.*`` tags; each head's kind, direction, sample size and model pair the
``head.<name>.*`` tags, so the UI and ``search_model_versions`` show them without downloads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from modelupgrade.errors import UserError

TAG_LOGGED_AS = "logged_as"
PYTORCH = "mlflow.pytorch"
MODEL_DIRECTORY = "model-directory"
CARD_ONLY = "card-and-checksums"
LOGGED_FORMS = (PYTORCH, MODEL_DIRECTORY, CARD_ONLY)

# The strategy and data hash an adopted generation is registered with: it was not trained here,
# and what it was trained on is unknown (its card lists it under ``adopted.unknown``).
ADOPTED_STRATEGY = "adopted"
UNKNOWN_DATA = "unknown (adopted)"
ADOPTED_KIND = "adopted.kind"
ADOPTED_SOURCE = "adopted.source"
# Adopted forms whose network is compiled foreign code that pickle cannot carry: logged as files.
COMPILED_SOURCES = ("torchscript", "torch_export")
# The file beside an embeddings-only model's card that names its vectors by checksum.
EMBEDDINGS_RECORD = "embeddings.json"
# MLflow caps a model-version tag value at 5000 characters.
_TAG_VALUE_LIMIT = 5000


@dataclass(frozen=True)
class ModelForm:
    """How one generation's model is logged: ``logged_as``, and for the file forms the files of
    its directory to log (the card first)."""

    logged_as: str = PYTORCH
    files: tuple[Path, ...] = ()
    # Tags that describe the model's origin (an adopted model's ``adopted.*``).
    tags: Mapping[str, str] | None = None
    adopted: bool = False


def model_form(model_dir: Path) -> ModelForm:
    """The form ``model_dir``'s model is logged in, read from its card: a card that is not a
    modelupgrade model card (or no card) is a model trained here."""
    from modelupgrade.models.card import ModelCard
    from modelupgrade.models.persistence import CARD_FILE

    card_path = model_dir / CARD_FILE
    if not card_path.is_file():
        return ModelForm()
    try:
        card = ModelCard.model_validate(json.loads(card_path.read_text(encoding="utf-8")))
    except ValueError:
        return ModelForm()
    adopted = card.adopted
    if adopted is None:
        return ModelForm()
    tags = adopted_tags(card)
    if not adopted.runs_on_images:
        return ModelForm(CARD_ONLY, (card_path,), {**tags, TAG_LOGGED_AS: CARD_ONLY}, True)
    if adopted.kind in COMPILED_SOURCES:
        files = (card_path, *(model_dir / name for name in sorted(card.weights_sha256)))
        return ModelForm(MODEL_DIRECTORY, files, {**tags, TAG_LOGGED_AS: MODEL_DIRECTORY}, True)
    return ModelForm(PYTORCH, (), {**tags, TAG_LOGGED_AS: PYTORCH}, True)


def adopted_tags(card: object) -> dict[str, str]:
    """The ``adopted.*`` version tags of an adopted model's card: source kind, file and sha256,
    preprocessing, the keys its file had that the network ignored, and what is unknown."""
    from modelupgrade.models.card import ModelCard

    assert isinstance(card, ModelCard) and card.adopted is not None
    adopted = card.adopted
    pre = adopted.preprocessing
    tags = {
        ADOPTED_KIND: adopted.kind,
        ADOPTED_SOURCE: adopted.source,
        "adopted.source_sha256": adopted.source_sha256,
        "adopted.runs_on_images": str(adopted.runs_on_images).lower(),
        "adopted.embedding_dim": str(card.embedding_dim),
        "adopted.preprocessing": "none (embeddings only)"
        if pre is None
        else f"input {pre.input_size}x{pre.input_size}, {pre.channels} channel(s), "
        f"mean {pre.mean}, std {pre.std}",
        "adopted.ignored_keys": ", ".join(adopted.ignored_keys) or "none",
        "adopted.unknown": "; ".join(adopted.unknown) or "none",
    }
    return {key: _fits(value) for key, value in tags.items()}


def head_tags(head_dirs: Mapping[str, Path]) -> dict[str, str]:
    """``head.<name>.*`` tags of every head logged beside a version: kind, whether training-free,
    direction, dimensions, the sample size it was fitted on and the models it maps between."""
    from modelupgrade.heads import HEADS
    from modelupgrade.heads.persistence import read_head_card

    tags: dict[str, str] = {}
    for name, directory in sorted(head_dirs.items()):
        card = read_head_card(directory)
        training_free = card.kind in HEADS.names() and HEADS.get(card.kind).training_free
        sample = card.training.get("sample_size")
        entries = {
            "kind": card.kind,
            "training_free": str(training_free).lower(),
            "direction": card.direction,
            "dims": f"{card.in_dim}->{card.out_dim}",
            "sample_size": "n/a" if sample is None else str(sample),
            "old_model": card.source_path("old_model") or "unknown",
            "new_model": card.source_path("new_model") or "unknown",
        }
        tags.update({f"head.{name}.{key}": _fits(value) for key, value in entries.items()})
    return tags


def embeddings_record(model_dir: Path) -> dict[str, object]:
    """What stands in for an embeddings-only model's vectors in the registry: their files'
    checksums (checked against the card), count and dimension, and why nothing loads."""
    from modelupgrade.cards import verified_weights
    from modelupgrade.models import read_model_card

    card = read_model_card(model_dir)
    assert card.adopted is not None
    files = {name: card.weights_sha256[name] for name in sorted(card.weights_sha256)}
    for name in files:
        verified_weights(model_dir, card, name)  # the registry records the files it checked
    return {
        "loadable_as_pytorch_model": False,
        "why": "an embeddings-only model holds the vectors of known items and cannot embed "
        "images; its vectors stay in the model directory it was registered from",
        "registered_from": str(model_dir),
        "source": card.adopted.source,
        "source_sha256": card.adopted.source_sha256,
        "files_sha256": files,
        "embedding_dim": card.embedding_dim,
        "items_checked_for": card.data.get("vectors_checked_for", {}),
    }


def not_loadable(registered_model: str, version: int, model_key: str) -> UserError:
    return UserError(
        f"{registered_model!r} v{version} ({model_key}) is an embeddings-only model: it cannot be "
        "loaded as a pytorch model",
        hint="its vectors are looked up by item id from the model directory it was registered "
        "from (the version's embeddings.json names its files and checksums); serve queries with a "
        "model that runs",
    )


def _fits(value: str) -> str:
    return value if len(value) <= _TAG_VALUE_LIMIT else value[: _TAG_VALUE_LIMIT - 1] + "…"
