"""The compatibility-strategy interface: what a new generation adds to its own classification loss.

The training engine always optimises the new model's classification loss (its classifier on its own
embeddings). A strategy adds compatibility terms computed from the same batch: the new embeddings
(with gradient) and the frozen old model's embeddings (no gradient). A strategy is an ``nn.Module``
so that whatever it holds (synthesised old classifier, UniBCT prototypes, DMU's ψ) is part of the
resumable checkpoint, and any trainable parameter it owns (ψ) is optimised with the model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from modelupgrade.config.base import Section
from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject
from modelupgrade.layers import MarginClassifier
from modelupgrade.models import EmbeddingModel, runs_on_images
from modelupgrade.plugins import Registry

log = logging.getLogger(__name__)


class StrategyOptions(Section):
    # Whether the old model embeds the same augmented view as the new model or its own random view
    # (DMU's Alg. 1 uses two views; BCT/BiCT regression reads naturally as the same view).
    old_view: Literal["same", "separate"] = "same"


class WeightedOptions(StrategyOptions):
    """Options of a strategy whose compatibility term has one weight in the total loss."""

    weight: float = Field(default=1.0, ge=0)


@dataclass
class StepInputs:
    """One training step as a strategy sees it."""

    labels: torch.Tensor  # (N,) int64
    new_features: torch.Tensor  # (N, D_new), L2-normalised, with gradient
    # (N, D_old), L2-normalised, detached; None without an old model
    old_features: torch.Tensor | None
    new_model: EmbeddingModel
    epoch: int


@dataclass
class TrainingContext:
    """The training set and helpers available to ``setup`` and ``on_epoch_start``."""

    labels: torch.Tensor  # (N,) on the training device
    epochs: int
    # Embeds every training image without augmentation (eval mode): (N, D) normalised float32.
    embed_training_set: Callable[[EmbeddingModel], torch.Tensor]
    old_model: EmbeddingModel | None = None
    _old_features: torch.Tensor | None = field(default=None, repr=False)

    def old_features(self) -> torch.Tensor:
        """Old-model embeddings of the whole training set, computed once (or given: an
        embeddings-only old model's vectors of the training images)."""
        if self._old_features is not None:
            return self._old_features
        if self.old_model is None:
            raise UserError(
                "this strategy needs the old model, but none was given",
                hint="pass --old <model dir>",
            )
        if self._old_features is None:
            self._old_features = self.embed_training_set(self.old_model)
        return self._old_features


STRATEGIES: Registry[CompatibilityStrategy] = Registry("strategy")


class CompatibilityStrategy(nn.Module):
    Options: ClassVar[type[StrategyOptions]] = StrategyOptions
    # Whether the strategy uses the old model at all (independent training does not).
    needs_old_model: ClassVar[bool] = True
    # Whether new and old embeddings are compared directly (same space ⇒ same dimension).
    needs_equal_dims: ClassVar[bool] = True
    # Whether every training step runs the old model on its batch (``StepInputs.old_features``).
    # False: the old embeddings of the training images (``TrainingContext.old_features``) and the
    # old classifier suffice, so an embeddings-only old model can serve.
    runs_old_model: ClassVar[bool] = True
    registry_name: ClassVar[str]
    options: StrategyOptions
    # Which rows of the old classifier are its own (``keep_old_prototypes``), a buffer.
    seen_classes: torch.Tensor

    def __init__(self, options: StrategyOptions | Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if not isinstance(options, StrategyOptions):
            options = self.Options.model_validate(dict(options or {}))
        self.options = options

    def check_models(self, new_model: EmbeddingModel, old_model: EmbeddingModel | None) -> None:
        name = getattr(self, "registry_name", type(self).__name__)
        if self.needs_old_model and old_model is None:
            raise UserError(
                f"strategy {name!r} needs the old model", hint="pass --old models/<scenario>/gen0"
            )
        if self.runs_old_model and old_model is not None and not runs_on_images(old_model):
            able = [k for k in STRATEGIES.names() if not STRATEGIES.get(k).runs_old_model]
            raise UserError(
                f"strategy {name!r} runs the old model on every training batch, but the old model "
                "is embeddings-only (adopted vectors): it cannot embed images",
                hint=f"use a strategy that needs only the old embeddings of the training images "
                f"({', '.join(able)}), or adopt the old model's network instead of its vectors",
            )
        if (
            self.needs_equal_dims
            and old_model is not None
            and old_model.embedding_dim != new_model.embedding_dim
        ):
            raise UserError(
                f"strategy {name!r} compares new and old embeddings directly, so both must have "
                f"the same dimension; the old model has {old_model.embedding_dim}, the new "
                f"architecture {new_model.embedding_dim}",
                hint="give the new architecture the old embedding_dim, or use a strategy that "
                "allows a dimension change (independent, then a transformation head)",
            )

    def setup(self, new_model: EmbeddingModel, context: TrainingContext) -> None:
        """Called once before training (and before a resumed checkpoint is loaded)."""
        self.check_models(new_model, context.old_model)

    def keep_old_prototypes(
        self, new_model: EmbeddingModel, context: TrainingContext
    ) -> torch.Tensor:
        """The old model's prototypes of every class of the new training set
        (``old_class_prototypes``); which rows are the old classifier's own is kept in the buffer
        ``seen_classes``."""
        assert context.old_model is not None
        prototypes, seen = old_class_prototypes(
            context.old_model, context.old_features(), context.labels, new_model.num_classes
        )
        self.register_buffer("seen_classes", seen)
        return prototypes

    def on_epoch_start(
        self, epoch: int, new_model: EmbeddingModel, context: TrainingContext
    ) -> None:
        """Called at the start of every epoch (UniBCT regenerates its prototypes here)."""

    def losses(self, step: StepInputs) -> dict[str, torch.Tensor]:
        """Weighted compatibility terms of this batch; the engine adds them to the
        classification loss."""
        raise NotImplementedError

    def artifacts(self) -> dict[str, dict[str, torch.Tensor]]:
        """Extra weight files to save next to the model: file name → state dict."""
        return {}

    def card_entries(self) -> JsonObject:
        """Extra fields for the model card."""
        return {}

    def describe(self) -> JsonObject:
        return {"kind": self.registry_name, "options": self.options.model_dump(mode="json")}


class OldClassifierStrategy(CompatibilityStrategy):
    """A strategy that scores new embeddings with the old classifier, frozen, over every class of
    the new training set: its own rows where it has them, else the synthesised ones
    (``keep_old_prototypes``). ``setup`` builds it as ``old_classifier``."""

    old_classifier: MarginClassifier

    def setup(self, new_model: EmbeddingModel, context: TrainingContext) -> None:
        super().setup(new_model, context)
        prototypes = self.keep_old_prototypes(new_model, context)
        assert context.old_model is not None
        self.old_classifier = frozen_classifier_like(
            old_classifier_template(context.old_model, new_model), prototypes
        )


def build_strategy(kind: str, options: Mapping[str, Any] | None = None) -> CompatibilityStrategy:
    strategy_class = STRATEGIES.get(kind)
    try:
        return strategy_class(strategy_class.Options.model_validate(dict(options or {})))
    except Exception as err:
        if isinstance(err, UserError):
            raise
        raise UserError(f"options of strategy kind {kind!r} are not valid: {err}") from None


# ---------------------------------------------------------------- shared building blocks


def class_means(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class mean of ``features`` (C, D) and a mask of the classes that have any sample."""
    sums = torch.zeros(num_classes, features.shape[1], device=features.device, dtype=torch.float32)
    sums.index_add_(0, labels, features.float())
    counts = torch.bincount(labels, minlength=num_classes).to(features.device)
    present = counts > 0
    return sums / counts.clamp(min=1).unsqueeze(1).float(), present


def old_class_prototypes(
    old_model: EmbeddingModel, old_features: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Frozen old-space prototypes for every class of the new training set, and which are real.

    Classes the old model was trained on keep their old classifier row; every other class (new
    classes, extended-/open-class) gets the synthesised classifier of the original BCT: the mean of
    the old model's embeddings of that class's new training images. Returns L2-normalised
    prototypes (C, D) and a bool mask (C,) that is True where the row is the old classifier's own.
    """
    if old_model.classifier is None:
        log.info(
            "the old model has no classifier (adopted): its classifier is synthesised as BCT "
            "does for new classes, from the mean old embedding of each class's training images"
        )
        old_weight = torch.zeros(0, old_features.shape[1], device=old_features.device)
    else:
        old_weight = F.normalize(old_model.classifier.weight.detach().float(), dim=1).to(
            old_features.device
        )
    trained = old_model.trained_classes
    seen = torch.zeros(num_classes, dtype=torch.bool, device=old_features.device)
    if trained is None:
        seen[: min(num_classes, old_weight.shape[0])] = True
    else:
        known = torch.tensor(
            [c for c in trained if c < num_classes], dtype=torch.long, device=old_features.device
        )
        seen[known] = True
    seen &= torch.arange(num_classes, device=old_features.device) < old_weight.shape[0]
    means, present = class_means(old_features, labels, num_classes)
    prototypes = F.normalize(means, dim=1)
    rows = torch.nonzero(seen).squeeze(1)
    prototypes[rows] = old_weight[rows]
    if not bool((seen | present).all()):
        missing = torch.nonzero(~(seen | present)).squeeze(1).tolist()
        # Such classes have no sample in the batch stream either; their row is never a target.
        prototypes[missing] = 0.0
    return prototypes, seen


def old_classifier_template(
    old_model: EmbeddingModel, new_model: EmbeddingModel
) -> MarginClassifier:
    """The classifier whose kind, scale and margin the old model's frozen classifier takes: its
    own, or the new model's when it has none (an adopted model)."""
    classifier: MarginClassifier | None = old_model.classifier
    return new_model.classifier if classifier is None else classifier


def frozen_classifier_like(
    template: MarginClassifier, prototypes: torch.Tensor
) -> MarginClassifier:
    """A copy of ``template``'s margin classifier whose prototype matrix is
    ``prototypes``, frozen."""
    from modelupgrade.layers import build_classifier

    kind = type(template).registry_name
    classifier = build_classifier(
        kind, prototypes.shape[1], prototypes.shape[0], template.scale, template.margin
    )
    classifier.weight.data.copy_(prototypes)
    classifier.weight.requires_grad_(False)
    return classifier.to(prototypes.device)
