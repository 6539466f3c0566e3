"""Contrastive compatibility: InfoNCE of a new embedding against old embeddings of the batch.

Positive: the old embedding of the same image. Negatives: old embeddings of images of other classes
(UniBCT's Eq. 12, ``contrastive``); RACT / hot-refresh (Zhang et al., ICLR 2022, ``ract``) adds the
NEW embeddings of other-class images as negatives, so that new-to-new pairs of different classes are
pushed apart too (no regression while the gallery is refreshed). τ = 0.05 (OpenCompatible).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from modelupgrade.strategies.base import (
    STRATEGIES,
    CompatibilityStrategy,
    StepInputs,
    WeightedOptions,
)


class ContrastiveOptions(WeightedOptions):
    temperature: float = Field(default=0.05, gt=0)
    new_negatives: bool = False


class RACTOptions(ContrastiveOptions):
    new_negatives: bool = True


def compatibility_info_nce(
    new_features: torch.Tensor,
    old_features: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    new_negatives: bool,
) -> torch.Tensor:
    new = F.normalize(new_features.float(), dim=1)
    old = F.normalize(old_features.float(), dim=1)
    same_class = labels[:, None] == labels[None, :]
    own = torch.eye(labels.shape[0], dtype=torch.bool, device=labels.device)
    to_old = (new @ old.t() / temperature).masked_fill(same_class & ~own, float("-inf"))
    logits = [to_old]
    if new_negatives:
        logits.append((new @ new.t() / temperature).masked_fill(same_class, float("-inf")))
    targets = torch.arange(labels.shape[0], device=labels.device)
    return F.cross_entropy(torch.cat(logits, dim=1), targets)


@STRATEGIES.register("contrastive")
class Contrastive(CompatibilityStrategy):
    Options = ContrastiveOptions
    options: ContrastiveOptions

    def losses(self, step: StepInputs) -> dict[str, torch.Tensor]:
        assert step.old_features is not None
        loss = compatibility_info_nce(
            step.new_features,
            step.old_features,
            step.labels,
            self.options.temperature,
            self.options.new_negatives,
        )
        return {self.registry_name: self.options.weight * loss}


@STRATEGIES.register("ract")
class RACT(Contrastive):
    Options = RACTOptions
    options: RACTOptions
