"""LCE (Meng et al., ICCV 2021), as re-implemented in the AdvBCT benchmark.

Two terms against the old class centres c_y (normalised mean old embedding of each class over the
new training set, computed once):
- alignment: the new classifier's prototypes are aligned with the old centres,
  mean(1 − cos(w_y, c_y));
- boundary: a new embedding must lie inside its old class's boundary, relu(∠(φ_new(x), c_y) − r_y),
  with r_y the class radius: the largest angle of an old embedding of the class to c_y once the
  outliers are dropped (``radius="max"``, the default; ``radius="mean"`` takes their mean instead).
  The outliers are the angles outside Tukey's fences [Q1 − k·IQR, Q3 + k·IQR] of the class,
  k = ``radius_outlier_iqr`` (1.5; ``None`` keeps every angle).
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


def class_quantile(
    sorted_values: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor, q: float
) -> torch.Tensor:
    """The q-quantile of each class (linear interpolation, as ``torch.quantile``), given values
    sorted within contiguous class segments that start at ``starts`` and hold ``counts`` values.
    Empty classes get 0."""
    position = q * (counts - 1).clamp(min=0).to(sorted_values.dtype)
    below = position.floor().long()
    above = position.ceil().long()
    last = max(sorted_values.numel() - 1, 0)
    low = sorted_values[(starts + below).clamp(max=last)]
    high = sorted_values[(starts + above).clamp(max=last)]
    value = low + (position - below.to(sorted_values.dtype)) * (high - low)
    return torch.where(counts > 0, value, torch.zeros_like(value))


def class_radii(
    angles: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    statistic: Literal["mean", "max"] = "max",
    outlier_iqr: float | None = 1.5,
) -> torch.Tensor:
    """Per-class radius (C,): the max (or mean) of each class's ``angles`` that lie inside its
    Tukey fences [Q1 − k·IQR, Q3 + k·IQR], k = ``outlier_iqr`` (None: no filter). Classes
    without a sample get 0.

    The quartiles interpolate linearly (the usual definition); AdvBCT reads them as
    sorted[⌊n/4⌋] and sorted[⌊3n/4⌋], which can move the fences slightly, most in small classes.
    With linear quartiles a class of three or fewer samples never loses one, as AdvBCT filters
    only classes of four or more. The fences always enclose the values between Q1 and Q3, so no
    class is emptied.
    """
    angles = angles.float()
    counts = torch.bincount(labels, minlength=num_classes)
    keep = torch.ones_like(angles, dtype=torch.bool)
    if outlier_iqr is not None and angles.numel() > 0:
        # Sort by angle, then stably by label: each class's angles are one sorted segment.
        by_angle = torch.argsort(angles)
        order = by_angle[torch.argsort(labels[by_angle], stable=True)]
        sorted_angles = angles[order]
        starts = torch.cumsum(counts, 0) - counts
        q1 = class_quantile(sorted_angles, starts, counts, 0.25)
        q3 = class_quantile(sorted_angles, starts, counts, 0.75)
        spread = outlier_iqr * (q3 - q1)
        keep = (angles >= (q1 - spread)[labels]) & (angles <= (q3 + spread)[labels])
    kept = torch.where(keep, angles, torch.zeros_like(angles))
    radii = torch.zeros(num_classes, device=angles.device)
    if statistic == "mean":
        radii.index_add_(0, labels, kept)
        kept_counts = torch.zeros(num_classes, device=angles.device)
        kept_counts.index_add_(0, labels, keep.float())
        return radii / kept_counts.clamp(min=1)
    # Angles are ≥ 0, so a dropped angle written as 0 never wins the max.
    return radii.scatter_reduce_(0, labels, kept, reduce="amax", include_self=True)


class LCEOptions(StrategyOptions):
    alignment_weight: float = Field(default=1.0, ge=0)
    boundary_weight: float = Field(default=1.0, ge=0)
    # LCE's boundary is the class's extent, so the radius is the max angle: the AdvBCT
    # re-implementation (extract_feat.py, gen_class_theta) keeps the largest angle that survives
    # its outlier filter. A mean radius would put about half of the old class outside its own
    # boundary and pull the new embeddings tighter than the old class ever was.
    radius: Literal["mean", "max"] = "max"
    # Tukey's fences with k = 1.5, the filter AdvBCT applies to each class's angles before taking
    # the max: one mislabelled or atypical image must not set the whole class's boundary.
    # None keeps every angle (the plain max).
    radius_outlier_iqr: float | None = Field(default=1.5, gt=0)


@STRATEGIES.register("lce")
class LCE(CompatibilityStrategy):
    Options = LCEOptions
    options: LCEOptions
    # Buffers set by setup: class centres and radii of the old embeddings, classes present.
    centres: torch.Tensor
    radii: torch.Tensor
    present: torch.Tensor
    runs_old_model = False

    def setup(self, new_model: EmbeddingModel, context: TrainingContext) -> None:
        super().setup(new_model, context)
        old_features = context.old_features()
        means, present = class_means(old_features, context.labels, new_model.num_classes)
        centres = F.normalize(means, dim=1)
        angles = angle(old_features, centres[context.labels])
        radii = class_radii(
            angles,
            context.labels,
            new_model.num_classes,
            self.options.radius,
            self.options.radius_outlier_iqr,
        )
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
