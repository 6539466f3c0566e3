"""BCT (Shen et al., CVPR 2020): the influence loss through the frozen old classifier.

New embeddings are classified by the old classifier (its own kind, scale and margin), which pulls
each new embedding towards its class's old prototype. Classes the old model never saw use the
synthesised classifier: the mean old embedding of the class over the new training set. ``mask``
instead drops those samples from the influence loss.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from modelupgrade.strategies.base import (
    STRATEGIES,
    OldClassifierStrategy,
    StepInputs,
    WeightedOptions,
)


class BCTOptions(WeightedOptions):
    unseen_classes: Literal["synthesise", "mask"] = "synthesise"


@STRATEGIES.register("bct")
class BCT(OldClassifierStrategy):
    Options = BCTOptions
    options: BCTOptions
    runs_old_model = False

    def losses(self, step: StepInputs) -> dict[str, torch.Tensor]:
        per_sample = self.old_classifier.loss(step.new_features, step.labels, reduction="none")
        if self.options.unseen_classes == "mask":
            keep = self.seen_classes[step.labels].float()
            influence = (per_sample * keep).sum() / keep.sum().clamp(min=1.0)
        else:
            influence = per_sample.mean()
        return {"bct": self.options.weight * influence}


def cosine_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row 1 − cos(a, b)."""
    return 1.0 - F.cosine_similarity(a.float(), b.float(), dim=1)
