"""LCE (Meng et al., ICCV 2021), as re-implemented in the AdvBCT benchmark.

Two terms against the old class centres c_y (normalised mean old embedding of each class over the
new training set, computed once):
- alignment: the new classifier's prototypes are aligned with the old centres,
  mean(1 − cos(w_y, c_y));
- boundary: a new embedding must lie inside its old class's boundary, relu(∠(φ_new(x), c_y) − r_y),
  with r_y the class radius: the ``radius`` statistic (mean or max) of the old
  embeddings' angles to c_y.
The original LCE also learns a transformation between the classifiers; it is not part of this form.
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
    StrategyOptions,
    TrainingContext,
    class_means,
)

_COS_EPS = 1e-6


def angle(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.acos(
        F.cosine_similarity(a.float(), b.float(), dim=1).clamp(-1 + _COS_EPS, 1 - _COS_EPS)
    )


class LCEOptions(StrategyOptions):
    alignment_weight: float = Field(default=1.0, ge=0)
    boundary_weight: float = Field(default=1.0, ge=0)
    radius: Literal["mean", "max"] = "mean"


@STRATEGIES.register("lce")
class LCE(CompatibilityStrategy):
    Options = LCEOptions

    def setup(self, new_model: EmbeddingModel, context: TrainingContext) -> None:
        super().setup(new_model, context)
        old_features = context.old_features()
        means, present = class_means(old_features, context.labels, new_model.num_classes)
        centres = F.normalize(means, dim=1)
        angles = angle(old_features, centres[context.labels])
        radii = torch.zeros(new_model.num_classes, device=old_features.device)
        if self.options.radius == "mean":
            radii.index_add_(0, context.labels, angles)
            radii /= torch.bincount(context.labels, minlength=new_model.num_classes).clamp(min=1)
        else:
            radii.scatter_reduce_(0, context.labels, angles, reduce="amax", include_self=True)
        self.register_buffer("centres", centres)
        self.register_buffer("radii", radii)
        self.register_buffer("present", present)

    def losses(self, step: StepInputs) -> dict[str, torch.Tensor]:
        labels = step.labels
        boundary = F.relu(
            angle(step.new_features, self.centres[labels]) - self.radii[labels]
        ).mean()
        classes = torch.unique(labels)
        prototypes = step.new_model.classifier.weight[classes]
        alignment = (
            1.0 - F.cosine_similarity(prototypes.float(), self.centres[classes], dim=1)
        ).mean()
        return {
            "lce_boundary": self.options.boundary_weight * boundary,
            "lce_alignment": self.options.alignment_weight * alignment,
        }
