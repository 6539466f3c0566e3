"""The options of each adopted model's source (``adopted.<name>.options`` in params.yaml, or the
``modelupgrade adopt`` command's): the network or file, and the preprocessing it expects."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from modelupgrade.config.base import Section
from modelupgrade.models.card import PreprocessingCard
from modelupgrade.models.embedding import PIXEL_MEAN, PIXEL_STD

_SHA256 = r"^[0-9a-f]{64}$"


class Preprocessing(Section):
    """The input the source network was trained on. ``mean``/``std`` (on [0, 1] pixels, one value
    per channel or one for all) left out are unknown: modelupgrade's own 0.5/0.5 is used and the
    card says so."""

    input_size: int = Field(ge=8)
    channels: Literal[1, 3] = 3
    mean: list[float] | None = None
    std: list[float] | None = None

    @model_validator(mode="after")
    def _per_channel(self) -> Preprocessing:
        for name in ("mean", "std"):
            values = getattr(self, name)
            if values is not None and len(values) not in (1, self.channels):
                raise ValueError(
                    f"{name} has {len(values)} values; give 1 or one per channel ({self.channels})"
                )
        if self.std is not None and min(self.std) <= 0:
            raise ValueError("std values must be positive")
        return self

    def card(self) -> PreprocessingCard:
        def per_channel(values: list[float] | None, default: float) -> list[float]:
            values = values or [default]
            return values * self.channels if len(values) == 1 else list(values)

        return PreprocessingCard(
            input_size=self.input_size,
            channels=self.channels,
            mean=per_channel(self.mean, PIXEL_MEAN),
            std=per_channel(self.std, PIXEL_STD),
        )

    def unknown(self) -> list[str]:
        return [
            f"preprocessing.{name} (assumed {default}, modelupgrade's own)"
            for name, default in (("mean", PIXEL_MEAN), ("std", PIXEL_STD))
            if getattr(self, name) is None
        ]


class SourceOptions(Section):
    """The adopted file, and optionally the sha256 it must have."""

    path: str
    sha256: str | None = Field(default=None, pattern=_SHA256)


class NetworkOptions(SourceOptions):
    preprocessing: Preprocessing
    # The dimension the embeddings must have: adoption fails when the network gives another one
    # (a dropped or wrong embedding layer). None: whatever the probe batch gives.
    embedding_dim: int | None = Field(default=None, ge=2)


class StateDictOptions(NetworkOptions):
    # The architecture the weights were saved from, and its constructor's keyword arguments.
    network: str
    network_kwargs: dict[str, Any] = Field(default_factory=dict)
    # A prefix every key of the file carries (e.g. "module." from DataParallel), removed.
    key_prefix: str = ""
    # The layer (a dotted attribute path, e.g. "fc") whose output is the embedding: the network
    # runs up to it and nothing is dropped. None: the network's features before its classifier.
    embedding_layer: str | None = None
    # The classifier (a dotted attribute path) dropped so that the network returns the features
    # it classifies. None: the architecture's own (torchvision "fc", timm's pretrained_cfg). When
    # the file holds weights for the layer dropped, it must be named here (or embedding_layer
    # set): a dropped layer might have been the embedding.
    classifier_layer: str | None = None

    @model_validator(mode="after")
    def _one_role(self) -> StateDictOptions:
        if self.embedding_layer is not None and self.classifier_layer is not None:
            raise ValueError(
                "give embedding_layer (the network runs up to it) or classifier_layer (dropped), "
                "not both"
            )
        return self


class TorchvisionOptions(StateDictOptions):
    pass


class TorchScriptOptions(NetworkOptions):
    pass


class TorchExportOptions(NetworkOptions):
    """A ``torch.export`` program (``torch.export.save``, a .pt2 file) whose forward maps images
    to (N, D) embeddings."""


class EmbeddingsOptions(SourceOptions):
    """A parquet table (an id column and a vector column), or a .npy matrix with ``ids``."""

    ids: str | None = None
    ids_sha256: str | None = Field(default=None, pattern=_SHA256)
    id_column: str = "item_id"
    vector_column: str = "embedding"
    # The dimension the vectors must have (None: whatever the table holds).
    embedding_dim: int | None = Field(default=None, ge=2)
