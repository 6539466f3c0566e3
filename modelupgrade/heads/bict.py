"""BiCT stage 2 (Su et al.): the feature upgrade module ψ, trained after the new model is frozen.

Loss: 1 − cos(ψ(φ_old(x)), φ_new(x)), both embeddings frozen. Paper settings: 4 FC layers of width
4096, SGD lr 1.0 (ten times the backbone's), momentum 0.9, weight decay 1e-4, batch 512, 30 epochs,
cosine with one warm-up epoch. For sequential upgrades the momentum variant feeds
(1 − m)·F_{i−1} + m·F_{i−2} (``input_momentum`` in params; see ``HeadChain``).
"""

from __future__ import annotations

import torch

from modelupgrade.config.heads import HeadTraining
from modelupgrade.heads.base import Head, HeadBatch, NoOptions
from modelupgrade.heads.losses import paired_distance


class BiCTUpgradeModule(Head[NoOptions], kind="bict", direction="forward"):
    TRAINING_DEFAULTS = HeadTraining(
        hidden_dim=4096, depth=4, epochs=30, batch_size=512, optimizer="sgd", lr=1.0
    )

    def loss(self, batch: HeadBatch) -> torch.Tensor:
        return paired_distance(self(batch.old), batch.new, "cosine").mean()
