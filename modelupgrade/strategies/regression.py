"""Cosine regression to the old embedding of the same image (AML's regression; BiCT's stage 1).

loss = λ · mean(1 − cos(φ_new(x), φ_old(x))). BiCT uses λ = 2 for one upgrade and λ = 3 in
sequential upgrades. (UniBCT's Eq. 11 prints this with a minus sign, which would push
the embeddings apart.)
"""

from __future__ import annotations

import torch
from pydantic import Field

from modelupgrade.strategies.base import (
    STRATEGIES,
    CompatibilityStrategy,
    StepInputs,
    WeightedOptions,
)
from modelupgrade.strategies.bct import cosine_distance


class RegressionOptions(WeightedOptions):
    weight: float = Field(default=2.0, ge=0)


@STRATEGIES.register("regression")
class Regression(CompatibilityStrategy):
    Options = RegressionOptions
    options: RegressionOptions

    def losses(self, step: StepInputs) -> dict[str, torch.Tensor]:
        assert step.old_features is not None
        return {
            "regression": self.options.weight
            * cosine_distance(step.new_features, step.old_features).mean()
        }
