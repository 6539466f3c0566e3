"""Focal distillation (PCT, Yan et al., CVPR 2021): distil more where the old model was right.

Per-sample weight α + β·1[old model classifies the sample correctly] times a distance between new
and old: ``cosine`` (1 − cos of the embeddings, the retrieval form; default) or ``kl`` (KL
divergence of the old classifier's posteriors on new vs old embeddings, logits scaled by the old
classifier's s and divided by ``temperature``). "Correct" is the OLD classifier's prediction on the
OLD embedding (the public toolbox uses the new model's prediction, which is not PCT).
PCT's α = 1, β = 5.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from modelupgrade.models import EmbeddingModel
from modelupgrade.strategies.base import (
    STRATEGIES,
    CompatibilityStrategy,
    StepInputs,
    TrainingContext,
    WeightedOptions,
)
from modelupgrade.strategies.bct import cosine_distance


class FocalDistillationOptions(WeightedOptions):
    alpha: float = Field(default=1.0, ge=0)
    beta: float = Field(default=5.0, ge=0)
    distance: Literal["cosine", "kl"] = "cosine"
    temperature: float = Field(default=1.0, gt=0)


def old_model_correct(
    old_features: torch.Tensor, labels: torch.Tensor, old_weight: torch.Tensor, seen: torch.Tensor
) -> torch.Tensor:
    """1[argmax over the old model's own classes of cos(φ_old(x), ω_old) == y] per sample."""
    cos = F.normalize(old_features.float(), dim=1) @ old_weight.t()
    cos = cos.masked_fill(~seen.unsqueeze(0), float("-inf"))
    return cos.argmax(dim=1) == labels


@STRATEGIES.register("focal_distillation")
class FocalDistillation(CompatibilityStrategy):
    Options = FocalDistillationOptions

    def setup(self, new_model: EmbeddingModel, context: TrainingContext) -> None:
        super().setup(new_model, context)
        self.register_buffer("old_prototypes", self.keep_old_prototypes(new_model, context))
        assert context.old_model is not None
        self.old_scale = float(context.old_model.classifier.scale)

    def sample_weights(self, old_features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        correct = old_model_correct(old_features, labels, self.old_prototypes, self.seen_classes)
        return self.options.alpha + self.options.beta * correct.float()

    def losses(self, step: StepInputs) -> dict[str, torch.Tensor]:
        assert step.old_features is not None
        weights = self.sample_weights(step.old_features, step.labels)
        if self.options.distance == "cosine":
            distance = cosine_distance(step.new_features, step.old_features)
        else:
            scale = self.old_scale / self.options.temperature
            new_log_p = F.log_softmax(
                scale * F.normalize(step.new_features.float(), dim=1) @ self.old_prototypes.t(),
                dim=1,
            )
            old_log_p = F.log_softmax(
                scale * F.normalize(step.old_features.float(), dim=1) @ self.old_prototypes.t(),
                dim=1,
            )
            distance = F.kl_div(new_log_p, old_log_p, log_target=True, reduction="none").sum(dim=1)
        return {"focal_distillation": self.options.weight * (weights * distance).mean()}
