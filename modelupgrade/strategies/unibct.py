"""UniBCT (Zhang et al., IJCAI 2022): ArcFace against graph-refined pseudo old prototypes.

For every class of the new training set, the old embeddings of its images are vertices of a graph
whose edges are the temperature-softmax (over each ROW, τ = 0.05) of the new model's cosine
similarities, zero diagonal. Propagation with restart, V∞ = (1 − λ)(I − λE)⁻¹V⁰ (λ = 0.9), is
averaged into the prototype. The paper's Alg. 2 takes that softmax over columns, which makes the
refined prototype exactly the plain mean; rows are what Eq. 6 says. The prototypes are regenerated
with the current new model after the warm-up epochs and then every ``refresh_every`` epochs; before
that the loss weight η is 0. ``mean`` (UniBCT*) and ``drop_mean`` (drop the 10% farthest) are the
paper's ablations.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from modelupgrade.errors import UserError
from modelupgrade.models import EmbeddingModel
from modelupgrade.strategies.base import (
    STRATEGIES,
    CompatibilityStrategy,
    StepInputs,
    TrainingContext,
    WeightedOptions,
    frozen_classifier_like,
)

log = logging.getLogger(__name__)


def propagation_weights(
    new_features: torch.Tensor, graph_lambda: float, temperature: float
) -> torch.Tensor:
    """Weights w (m,) with prototype = wᵀV⁰: column means of A = (1 − λ)(I − λE)⁻¹.

    (1/m)·1ᵀA V⁰ needs only Aᵀ1, one linear solve with (I − λE)ᵀ instead of an inverse.
    """
    m = new_features.shape[0]
    if m == 1:
        return torch.ones(1, device=new_features.device)
    unit = F.normalize(new_features.float(), dim=1)
    similarity = unit @ unit.t() / temperature
    similarity.fill_diagonal_(float("-inf"))
    transition = torch.softmax(similarity, dim=1)
    identity = torch.eye(m, device=new_features.device)
    column_sums = torch.linalg.solve(
        (identity - graph_lambda * transition).t(), torch.ones(m, 1, device=new_features.device)
    )
    return (1.0 - graph_lambda) * column_sums.squeeze(1) / m


def refined_prototypes(
    new_features: torch.Tensor,
    old_features: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    graph_lambda: float = 0.9,
    temperature: float = 0.05,
    method: Literal["refined", "mean", "drop_mean"] = "refined",
    drop_ratio: float = 0.1,
) -> torch.Tensor:
    """Pseudo old prototypes (C, D_old) from old embeddings of each class, L2-normalised."""
    prototypes = torch.zeros(num_classes, old_features.shape[1], device=old_features.device)
    for cls in torch.unique(labels).tolist():
        rows = torch.nonzero(labels == cls).squeeze(1)
        old = old_features[rows].float()
        if method == "refined":
            weights = propagation_weights(new_features[rows], graph_lambda, temperature)
            prototypes[cls] = weights @ old
        elif method == "mean":
            prototypes[cls] = old.mean(dim=0)
        else:
            distance = (old - old.mean(dim=0)).norm(dim=1)
            keep = max(1, round(len(rows) * (1.0 - drop_ratio)))
            prototypes[cls] = old[distance.argsort()[:keep]].mean(dim=0)
    return F.normalize(prototypes, dim=1)


class UniBCTOptions(WeightedOptions):  # weight: η after the warm-up
    warmup_epochs: int = Field(default=10, ge=0)
    refresh_every: int = Field(default=10, ge=1)
    graph_lambda: float = Field(default=0.9, ge=0, lt=1)
    temperature: float = Field(default=0.05, gt=0)
    prototype: Literal["refined", "mean", "drop_mean"] = "refined"
    drop_ratio: float = Field(default=0.1, ge=0, lt=1)
    # ArcFace of the compatibility term; None = the new model's classifier's s and m (the paper).
    scale: float | None = Field(default=None, gt=0)
    margin: float | None = Field(default=None, ge=0)


@STRATEGIES.register("unibct")
class UniBCT(CompatibilityStrategy):
    Options = UniBCTOptions
    options: UniBCTOptions
    runs_old_model = False

    def setup(self, new_model: EmbeddingModel, context: TrainingContext) -> None:
        super().setup(new_model, context)
        if self.options.warmup_epochs >= context.epochs:
            raise UserError(
                f"UniBCT's warm-up ({self.options.warmup_epochs} epochs) is not shorter than the "
                f"training ({context.epochs} epochs), so its compatibility "
                "loss would never be used",
                hint="lower strategies.<name>.options.warmup_epochs or raise training.epochs",
            )
        template = new_model.classifier
        self.compat_classifier = frozen_classifier_like(
            template,
            torch.zeros(
                new_model.num_classes, new_model.embedding_dim, device=context.labels.device
            ),
        )
        if self.options.scale is not None:
            self.compat_classifier.scale = self.options.scale
        if self.options.margin is not None:
            self.compat_classifier.margin = self.options.margin

    def is_refresh_epoch(self, epoch: int) -> bool:
        since = epoch - self.options.warmup_epochs
        return since >= 0 and since % self.options.refresh_every == 0

    def on_epoch_start(
        self, epoch: int, new_model: EmbeddingModel, context: TrainingContext
    ) -> None:
        if not self.is_refresh_epoch(epoch):
            return
        new_features = context.embed_training_set(new_model)
        prototypes = refined_prototypes(
            new_features,
            context.old_features(),
            context.labels,
            new_model.num_classes,
            self.options.graph_lambda,
            self.options.temperature,
            self.options.prototype,
            self.options.drop_ratio,
        )
        self.compat_classifier.weight.data.copy_(prototypes)
        log.info("UniBCT: regenerated %s prototypes at epoch %d", self.options.prototype, epoch)

    def losses(self, step: StepInputs) -> dict[str, torch.Tensor]:
        if step.epoch < self.options.warmup_epochs:
            return {}
        return {
            "unibct": self.options.weight
            * self.compat_classifier.loss(step.new_features, step.labels)
        }
