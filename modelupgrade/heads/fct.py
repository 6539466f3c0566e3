"""FCT (Ramanujan et al.): regress the new embedding from the old one, optionally
with side information.

Settings follow the official FCT code as FastFill re-used it: Adam 5e-4, weight decay 3.05e-5,
batch 1024, 80 epochs, cosine with 5 warm-up epochs, BatchNorm frozen after half the epochs, a
4-layer MLP of width 2048. Side information (a per-image vector stored next to the gallery
embedding, e.g. a self-supervised feature) is concatenated to the old embedding at the input.
"""

from __future__ import annotations

import torch

from modelupgrade.config.base import Section
from modelupgrade.config.heads import HeadTraining
from modelupgrade.heads.base import Head, HeadBatch
from modelupgrade.heads.losses import Reduction, squared_error


class FCTOptions(Section):
    # "mean" over dimensions is the official code's nn.MSELoss; "sum" is the paper's ‖·‖².
    reduction: Reduction = "mean"


class FCTAdapter(Head[FCTOptions], kind="fct", direction="forward", accepts_side_info=True):
    # The official FCT code's recipe; FastFill trains its adapter the same way.
    TRAINING_DEFAULTS = HeadTraining.adam(
        hidden_dim=2048,
        depth=4,
        epochs=80,
        batch_size=1024,
        lr=5e-4,
        weight_decay=3.0517578125e-5,
        warmup_epochs=5,
        warmup_start_ratio=1e-2,
        freeze_bn_after=0.5,
    )

    def loss(self, batch: HeadBatch) -> torch.Tensor:
        transformed = self(batch.old, batch.side_info)
        return squared_error(transformed, batch.new, self.options.reduction).mean()
