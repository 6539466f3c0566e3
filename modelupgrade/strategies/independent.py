"""Independent training: the new model with no compatibility term (the papers' "oracle" row)."""

from __future__ import annotations

import torch

from modelupgrade.strategies.base import STRATEGIES, CompatibilityStrategy, StepInputs


@STRATEGIES.register("independent")
class Independent(CompatibilityStrategy):
    needs_old_model = False
    needs_equal_dims = False

    def losses(self, step: StepInputs) -> dict[str, torch.Tensor]:
        return {}
