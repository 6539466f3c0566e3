"""Reverse query transform (Seo et al. §4.1): ψ_rev maps a new-model query into the old space.

Loss (Eq. 9): d(ψ_rev(φ_new(x)), φ_old(x)), cosine distance as in the paper's experiments. The query
then searches the not-yet-backfilled old part of the gallery with ψ_rev(φ_new(q)) and the backfilled
part with φ_new(q); the two rankings merge by distance. Paper settings: 2 blocks (CIFAR-100, GLDv2),
Adam 1e-4, 50 epochs, cosine; width and batch size are not given (256 / 512 here).
"""

from __future__ import annotations

import torch

from modelupgrade.config.base import Section
from modelupgrade.config.heads import HeadTraining
from modelupgrade.heads.base import Head, HeadBatch
from modelupgrade.heads.losses import Distance, paired_distance

REVERSE_DEFAULTS = HeadTraining.adam(hidden_dim=256, depth=2, epochs=50, batch_size=512, lr=1e-4)


class RQTOptions(Section):
    distance: Distance = "cosine"


class ReverseQueryTransform(Head[RQTOptions], kind="rqt", direction="reverse"):
    TRAINING_DEFAULTS = REVERSE_DEFAULTS

    def loss(self, batch: HeadBatch) -> torch.Tensor:
        return paired_distance(self(batch.new), batch.old, self.options.distance).mean()
