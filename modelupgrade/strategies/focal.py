"""Focal distillation (PCT, Yan et al., CVPR 2021): distil more where the old model was right.

Per-sample weight α + β·1[old model classifies the sample correctly] times a distance between new
and old: ``cosine`` (1 − cos of the embeddings, the retrieval form; default) or ``kl``: PCT's FD-KL,
T²·KL(softmax(z_old/T) ‖ softmax(z_new/T)) with z the old classifier's logits (its s · cosine to
its prototypes) on the old and the new embedding and T = ``temperature``. "Correct" is the OLD
classifier's prediction on the OLD embedding (the public toolbox uses the new model's prediction,
which is not PCT); a sample whose class the old classifier does not have (a new class of an
extended- or open-class upgrade) is never correct. PCT's α = 1, β = 5, T = 100.
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
    old_classifier_template,
)
from modelupgrade.strategies.bct import cosine_distance


class FocalDistillationOptions(WeightedOptions):
    alpha: float = Field(default=1.0, ge=0)
    beta: float = Field(default=5.0, ge=0)
    distance: Literal["cosine", "kl"] = "cosine"
    # The KL's temperature, on old and new logits alike (``distance="kl"`` only). PCT (Yan et al.,
    # CVPR 2021) distils with FD-KL at T = 100, as do the public PCT baselines (kl_temperature=100,
    # τ = 100): a high T compares the whole logit vectors, not just the top class. The loss is
    # multiplied by T² (Hinton et al., 2015) so its gradients keep their scale as T grows.
    temperature: float = Field(default=100.0, gt=0)


def old_model_correct(
    old_features: torch.Tensor, labels: torch.Tensor, old_weight: torch.Tensor, seen: torch.Tensor
) -> torch.Tensor:
    """1[argmax over the old model's own classes of cos(φ_old(x), ω_old) == y] per sample.

    ``seen`` marks the rows of ``old_weight`` that are the old classifier's own classes. A sample
    whose label is not one of them (a class added since, or beyond the old classifier's rows) is
    never correct: the old model cannot be right on a class it does not know.
    """
    rows = seen.numel()
    if rows == 0:
        return torch.zeros_like(labels, dtype=torch.bool)
    cos = F.normalize(old_features.float(), dim=1) @ old_weight.t()
    cos = cos.masked_fill(~seen.unsqueeze(0), float("-inf"))
    # Without this, an old classifier that has none of the classes (every column −inf) "predicts"
    # argmax 0 and every label-0 sample counts as correct. The clamp keeps the lookup in range
    # for labels past the old classifier's rows; ``in_range`` then rules them out.
    in_range = (labels >= 0) & (labels < rows)
    known = in_range & seen[labels.clamp(0, rows - 1)]
    return known & (cos.argmax(dim=1) == labels)


@STRATEGIES.register("focal_distillation")
class FocalDistillation(CompatibilityStrategy):
    Options = FocalDistillationOptions
    options: FocalDistillationOptions
    old_prototypes: torch.Tensor  # a buffer, set by setup

    def setup(self, new_model: EmbeddingModel, context: TrainingContext) -> None:
        super().setup(new_model, context)
        self.register_buffer("old_prototypes", self.keep_old_prototypes(new_model, context))
        assert context.old_model is not None
        self.old_scale = float(old_classifier_template(context.old_model, new_model).scale)

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
            # T²: the soft targets' gradients shrink as 1/T², this restores their scale.
            distance = self.options.temperature**2 * F.kl_div(
                new_log_p, old_log_p, log_target=True, reduction="none"
            ).sum(dim=1)
        return {"focal_distillation": self.options.weight * (weights * distance).mean()}
