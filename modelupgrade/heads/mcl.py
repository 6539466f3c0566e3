"""Reverse query transform trained with the metric-compatible contrastive loss (Seo et al. §4.2).

MCL replaces the RQT loss: distances of the backward system {ψ_rev(φ_new), φ_old} and of the new
system {φ_new, φ_new} are calibrated against each other, so that merging the two rankings by raw
distance is meaningful. Needs class-balanced batches (several images per class).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field

from modelupgrade.config.base import Section
from modelupgrade.heads.base import Head, HeadBatch
from modelupgrade.heads.losses import (
    Distance,
    metric_compatible_contrastive_loss,
    pairwise_distance,
)
from modelupgrade.heads.rqt import REVERSE_DEFAULTS


class MCLOptions(Section):
    distance: Distance = "cosine"
    temperature: float = Field(default=1.0, gt=0)
    hard_mining: bool = True
    mining_fraction: float = Field(default=0.5, gt=0, le=1)
    mining_scope: Literal["per_system", "joint"] = "per_system"
    # k = i in the backward system is the RQT pair; in the new system it is the constant exp(0).
    self_positive_old: bool = True
    self_positive_new: bool = False
    # False gives the CL-M ablation (each system's denominator holds only its own negatives).
    heterogeneous_negatives: bool = True
    samples_per_class: int = Field(default=4, ge=2)

    def loss_kwargs(self) -> dict[str, Any]:
        return self.model_dump(exclude={"distance", "samples_per_class"})


def mcl_loss(
    query_old_side: torch.Tensor, new_side: torch.Tensor, batch: HeadBatch, options: MCLOptions
) -> torch.Tensor:
    old_side = pairwise_distance(query_old_side, batch.old, options.distance)
    new_system = pairwise_distance(new_side, new_side, options.distance)
    return metric_compatible_contrastive_loss(
        old_side, new_system, batch.labels, **options.loss_kwargs()
    )


class MCLReverseTransform(
    Head[MCLOptions], kind="mcl", direction="reverse", class_balanced_batches=True, aligns=False
):
    TRAINING_DEFAULTS = REVERSE_DEFAULTS

    def loss(self, batch: HeadBatch) -> torch.Tensor:
        return mcl_loss(self(batch.new), batch.new, batch, self.options)
