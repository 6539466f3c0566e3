"""Models made elsewhere, adopted as generations: one source class per form, in ``MODEL_SOURCES``.

``modelupgrade adopt`` turns a model trained outside this tool into a model directory with the same
layout as a trained generation (``card.json`` + ``checkpoint.pt``, every file hashed), so that
training a successor, embedding, heads, the registry and the store take it like any other. The
forms that run on images (timm and torchvision state dicts, TorchScript, torch.export programs)
are in ``modelupgrade.models.adopted_networks``; here is the one that cannot run any more:

- ``embeddings``: precomputed vectors of known items, for an old model that can no longer run.

A network's embedding is its output, or a named layer's (``embedding_layer``); a classifier head
is dropped only when named or when the file holds no weights for it. Images are brought to the
source's channels and input size and normalised with its mean and std; what the card cannot
know (training data, a mean and std left out, the classifier) is listed under
``adopted.unknown``. No adopted model carries a classifier: a strategy that needs one synthesises
it from class means of the old embeddings.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from modelupgrade.cards import CARD_FILE, load_weights, verified_weights
from modelupgrade.errors import UserError
from modelupgrade.io import atomic_path, file_sha256, write_json
from modelupgrade.models.adopted_modules import (
    AdoptedNetwork,
    PrecomputedEmbeddings,
    runs_on_images,
)
from modelupgrade.models.adopted_networks import (
    TimmSource,
    TorchExportSource,
    TorchScriptSource,
    TorchvisionSource,
)
from modelupgrade.models.adoption_options import EmbeddingsOptions, Preprocessing, SourceOptions
from modelupgrade.models.adoption_source import (
    MODEL_SOURCES,
    Adoption,
    ModelSource,
    build_source,
    check_declared_dim,
)
from modelupgrade.models.card import MODEL_WEIGHTS_FILE, ModelCard
from modelupgrade.models.weights_file import checked_file

log = logging.getLogger(__name__)

ITEM_IDS_FILE = "item_ids.parquet"


@MODEL_SOURCES.register("embeddings")
class EmbeddingsSource(ModelSource):
    """Precomputed vectors: a parquet table with an id and a vector column, or a .npy matrix with
    an ``ids`` file (.parquet with the id column, or text with one id a line) in row order."""

    Options: ClassVar[type[SourceOptions]] = EmbeddingsOptions
    runs_on_images: ClassVar[bool] = False

    def table(self, path: Path) -> tuple[list[str], np.ndarray]:
        """The ids and vectors of the source: the project's one vector table format
        (``modelupgrade.data.vector_table``), its id and vector columns as the options name."""
        from modelupgrade.data.vector_table import read_vector_table

        options = self.options
        assert isinstance(options, EmbeddingsOptions)
        ids_path = None
        if options.ids is not None:
            ids_path, _ = checked_file(options.ids, options.ids_sha256, "ids file")
        table = read_vector_table(
            path, "embeddings table", ids_path, options.id_column, options.vector_column
        )
        return table.item_ids, table.vectors

    def adopt(self, path: Path, required: Mapping[str, Sequence[str]]) -> Adoption:
        import pandas as pd

        ids, vectors = self.table(path)
        assert isinstance(self.options, EmbeddingsOptions)
        check_declared_dim(
            vectors.shape[1],
            self.options.embedding_dim,
            f"the embeddings table {path}",
            "point path at the old model's vectors, or correct embedding_dim",
        )
        module = PrecomputedEmbeddings(
            F.normalize(torch.from_numpy(vectors), dim=1), ids, str(path)
        )
        for split, split_ids in required.items():
            module.rows(split_ids, split)
        unknown = ["architecture, weights and preprocessing (embeddings only: it cannot run)"]
        return Adoption(
            module,
            vectors.shape[1],
            {
                "files": {"item_ids": ITEM_IDS_FILE},
                "runs_on_images": self.runs_on_images,
                "unknown": unknown,
                "checked_splits": {split: len(split_ids) for split, split_ids in required.items()},
            },
            {ITEM_IDS_FILE: lambda target: pd.DataFrame({"item_id": ids}).to_parquet(target)},
            embedding_from=f"precomputed vectors of {len(ids)} items",
        )

    @classmethod
    def rebuild(cls, card: ModelCard, directory: Path) -> nn.Module:
        import pandas as pd

        assert card.adopted is not None
        ids_path = verified_weights(directory, card, card.adopted.files["item_ids"])
        ids = pd.read_parquet(ids_path)["item_id"].tolist()
        return PrecomputedEmbeddings(torch.zeros(len(ids), card.embedding_dim), ids, str(directory))


# ---------------------------------------------------------------- save and load


def adopt_model(
    kind: str,
    options: Mapping[str, Any],
    out_dir: str | Path,
    required: Mapping[str, Sequence[str]] | None = None,
    card_fields: Mapping[str, Any] | None = None,
) -> ModelCard:
    """Adopt the source ``kind`` with ``options`` into the model directory ``out_dir``, written
    whole or not at all; returns its card."""
    source = build_source(kind, options)
    path, digest = checked_file(source.options.path, source.options.sha256, f"{kind} source")
    adoption = source.adopt(path, required or {})
    entries = adoption.card
    checked = entries.get("checked_splits")
    adopted = {key: value for key, value in entries.items() if key != "checked_splits"}
    module = adoption.module.eval()
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        state = {name: t.detach().cpu().clone() for name, t in module.state_dict().items()}
        torch.save(state, tmp / MODEL_WEIGHTS_FILE)
        for name, write in adoption.files.items():
            write(tmp / name)
        hashes = {name: file_sha256(tmp / name) for name in [MODEL_WEIGHTS_FILE, *adoption.files]}
        preprocessing = entries.get("preprocessing")
        card = ModelCard.model_validate(
            {
                "format": ModelCard.FORMAT,
                "weights_sha256": hashes,
                "architecture": None,
                "in_chans": None if preprocessing is None else preprocessing.channels,
                "input_size": None if preprocessing is None else preprocessing.input_size,
                "embedding_dim": adoption.embedding_dim,
                "num_classes": 0,
                "classifier": None,
                "parameters": sum(p.numel() for p in module.parameters()),
                "generation": 0,
                **(card_fields or {}),
                "data": {
                    **dict((card_fields or {}).get("data", {})),
                    **({"vectors_checked_for": checked} if checked else {}),
                },
                "adopted": {
                    "kind": kind,
                    "source": str(path),
                    "source_sha256": digest,
                    "options": source.options.model_dump(mode="json"),
                    "embedding_from": adoption.embedding_from,
                    **adopted,
                    "unknown": [
                        "training data and training run",
                        "classifier (strategies that need one synthesise class means)",
                        *entries.get("unknown", []),
                    ],
                },
            }
        )
        write_json(tmp / CARD_FILE, card.as_dict())
    log.info(
        "adopted %s %s as %s (%d-dimensional embeddings)",
        kind,
        path,
        out_dir,
        adoption.embedding_dim,
    )
    return card


def load_adopted(directory: str | Path, card: ModelCard) -> nn.Module:
    """The adopted model saved in ``directory`` (its card read), its checked weights loaded."""
    assert card.adopted is not None
    module = MODEL_SOURCES.get(card.adopted.kind).rebuild(card, Path(directory))
    try:
        module.load_state_dict(load_weights(directory, card))
    except RuntimeError as err:
        raise UserError(
            f"{Path(directory) / MODEL_WEIGHTS_FILE} does not match its card: "
            f"{str(err).splitlines()[0]}"
        ) from None
    return module


__all__ = [
    "MODEL_SOURCES",
    "AdoptedNetwork",
    "Adoption",
    "EmbeddingsSource",
    "ModelSource",
    "PrecomputedEmbeddings",
    "Preprocessing",
    "TimmSource",
    "TorchExportSource",
    "TorchScriptSource",
    "TorchvisionSource",
    "adopt_model",
    "build_source",
    "check_declared_dim",
    "load_adopted",
    "runs_on_images",
]
