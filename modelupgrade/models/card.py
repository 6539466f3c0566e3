"""The model card: what a saved embedding model is, how it was trained and from what.

``load_model`` rebuilds the network from the first group of fields alone; the rest record the
training run (strategy, parent generation, data, hyper-parameters, loss history, device,
throughput) for the registry, the report and a person deciding on an upgrade.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from modelupgrade.cards import Card
from modelupgrade.config.training import ArchitectureParams
from modelupgrade.json_data import JsonObject, number_at

MODEL_WEIGHTS_FILE = "checkpoint.pt"


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClassifierCard(_Part):
    kind: str
    scale: float
    margin: float


class StrategyCard(_Part):
    """The compatibility strategy the model was trained with (``independent`` for generation 0)."""

    name: str
    kind: str
    options: dict[str, Any]


class ParentCard(_Part):
    """The previous generation: its directory and the sha256 of its card."""

    path: str
    card_sha256: str


class JointHeadCard(_Part):
    """A forward adapter ψ the strategy trained jointly with the model (DMU), saved beside it."""

    file: str
    in_dim: int
    out_dim: int
    hidden_dim: int
    hidden: int
    depth: int
    batch_norm: bool
    trained_with: str


class PreprocessingCard(_Part):
    """What an adopted network expects: images are brought to ``channels`` and resized
    (bilinear) to ``input_size``, scaled to [0, 1], then normalised with ``mean`` and ``std``."""

    input_size: int
    channels: int
    mean: list[float]
    std: list[float]


class AdoptedCard(_Part):
    """Where a model made elsewhere came from (``modelupgrade adopt``) and what is not known."""

    kind: str
    source: str
    source_sha256: str
    options: dict[str, Any]
    preprocessing: PreprocessingCard | None = None
    # Keys of the source file the network does not use (a classifier head), ignored.
    ignored_keys: list[str] = Field(default_factory=list)
    # Role → file in the model directory beside checkpoint.pt (hashed in weights_sha256).
    files: dict[str, str] = Field(default_factory=dict)
    # Whether the model can embed images (an embeddings-only model holds vectors of known items).
    runs_on_images: bool = True
    # Where the embedding comes from, in words (a named layer, the features before a dropped
    # classifier, the network's output, precomputed vectors).
    embedding_from: str = ""
    unknown: list[str] = Field(default_factory=list)


class ModelCard(Card):
    FORMAT: ClassVar[str] = "modelupgrade-model/1"
    WEIGHTS_FILE: ClassVar[str] = MODEL_WEIGHTS_FILE
    WHAT: ClassVar[str] = "model"

    # What the network is.
    # None for an adopted model, whose network ``adopted`` describes instead.
    architecture: ArchitectureParams | None
    in_chans: int | None
    input_size: int | None
    embedding_dim: int
    num_classes: int
    classifier: ClassifierCard | None
    trained_classes: list[int] | None = None
    parameters: int
    # How it was trained, and from what.
    generation: int | None = None
    architecture_name: str | None = None
    strategy: StrategyCard | None = None
    parent: ParentCard | None = None
    seed: int | None = None
    data: JsonObject = Field(default_factory=dict)
    training: JsonObject = Field(default_factory=dict)
    history: list[dict[str, float]] = Field(default_factory=list)
    # The trained model's fit to its own training images (``modelupgrade.training.convergence``).
    fit: dict[str, float] | None = None
    train_seconds: float | None = None
    train_images_per_second: float | None = None
    resumed_from_epoch: int | None = None
    device: str | None = None
    training_processes: int | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    forward_head: JointHeadCard | None = None
    # The local weights file the backbone started from (``architectures.<name>.pretrained``).
    initialised_from: JsonObject | None = None
    adopted: AdoptedCard | None = None

    @model_validator(mode="after")
    def _one_description_of_the_network(self) -> ModelCard:
        if (self.architecture is None) == (self.adopted is None):
            raise ValueError("a model card has either an architecture or an adopted entry")
        if self.adopted is None and (self.classifier is None or self.in_chans is None):
            raise ValueError("a trained model's card names its classifier and input channels")
        return self

    @model_serializer(mode="wrap")
    def _without_unset_origins(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Left out when unset, so that the cards of models trained from scratch are byte for byte
        # what they were before these fields existed.
        data = handler(self)
        for name in ("initialised_from", "adopted"):
            if data.get(name) is None:
                data.pop(name, None)
        return data

    def headline_metrics(self) -> dict[str, float]:
        """Final losses, epochs, seconds, throughput, parameters, data size: what a run logs."""
        metrics: dict[str, float] = {"epochs": len(self.history), "parameters": self.parameters}
        for name in ("train_seconds", "train_images_per_second"):
            if getattr(self, name) is not None:
                metrics[name] = getattr(self, name)
        if "images" in self.data:
            metrics["images"] = number_at(self.data, "images")
        if self.history:
            last = self.history[-1]
            metrics["final_loss"] = last.get("loss", float("nan"))
            metrics.update({f"final_{k}": v for k, v in last.items() if k.startswith("loss_")})
        return metrics

    @property
    def backward_compatible(self) -> bool:
        """Trained to be compared with its parent's vectors (any strategy but independent)."""
        return (
            self.parent is not None
            and self.strategy is not None
            and self.strategy.kind != "independent"
        )
