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


class StateDictOptions(NetworkOptions):
    # The architecture the weights were saved from, and its constructor's keyword arguments.
    network: str
    network_kwargs: dict[str, Any] = Field(default_factory=dict)
    # A prefix every key of the file carries (e.g. "module." from DataParallel), removed.
    key_prefix: str = ""


class TorchvisionOptions(StateDictOptions):
    # The classifier layer (a dotted attribute path) replaced by the identity, so that the network
    # returns the features it classifies.
    classifier_layer: str = "fc"


class TorchScriptOptions(NetworkOptions):
    # The dimension the output must have; None: whatever the probe batch gives.
    embedding_dim: int | None = Field(default=None, ge=2)


class EmbeddingsOptions(SourceOptions):
    """A parquet table (an id column and a vector column), or a .npy matrix with ``ids``."""

    ids: str | None = None
    ids_sha256: str | None = Field(default=None, pattern=_SHA256)
    id_column: str = "item_id"
    vector_column: str = "embedding"
