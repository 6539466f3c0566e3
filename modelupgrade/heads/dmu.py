"""DMU forward adaptation (Zhang et al.): ψ(φ_old(x)) classified by the new classifier with ArcFace.

Structure 3 × [fc-bn-relu] + fc, width 1024. When the new model was trained with the DMU strategy,
ψ was trained jointly with it (its loss also moved the new classifier) and saved next to the model
as ``forward_head.pt``; ``from_joint_training`` wraps that ψ instead of training a new one.
Standalone training (for a new model from any other strategy) freezes the new classifier.
The paper gives no separate ψ learning rate; the backbone's SGD 0.1, batch 512, 30 epochs are used.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from modelupgrade.config.base import Section
from modelupgrade.config.heads import HeadTraining
from modelupgrade.errors import UserError
from modelupgrade.heads.base import Head, HeadBatch


class DMUOptions(Section):
    # Wrap the ψ trained jointly with a DMU new model when the model directory has one.
    use_joint_head: bool = True


class DMUForwardAdapter(
    Head[DMUOptions], kind="dmu", direction="forward", needs_classifier=True, aligns=False
):
    TRAINING_DEFAULTS = HeadTraining(
        hidden_dim=1024, depth=4, epochs=30, batch_size=512, optimizer="sgd", lr=0.1
    )

    def loss(self, batch: HeadBatch) -> torch.Tensor:
        if batch.classifier is None:
            raise UserError("the DMU forward adapter needs the new model's classifier to train")
        return batch.classifier.loss(self(batch.old), batch.labels)

    @staticmethod
    def has_joint_head(model_dir: str | Path) -> bool:
        from modelupgrade.models.persistence import read_model_card

        return read_model_card(model_dir).forward_head is not None

    @classmethod
    def trained_with(
        cls, new_model_dir: str | Path, options: Mapping[str, Any] | None = None
    ) -> DMUForwardAdapter | None:
        """The ψ the DMU strategy trained jointly with the new model, unless
        ``options.use_joint_head`` is off or the model directory has none."""
        if not DMUOptions.model_validate(options or {}).use_joint_head:
            return None
        return cls.from_joint_training(new_model_dir) if cls.has_joint_head(new_model_dir) else None

    @classmethod
    def from_joint_training(cls, model_dir: str | Path) -> DMUForwardAdapter:
        """Wrap the ψ that the DMU strategy trained jointly with the new model in ``model_dir``."""
        from modelupgrade.cards import load_weights
        from modelupgrade.models.persistence import read_model_card

        card = read_model_card(model_dir)
        dims = card.forward_head
        if dims is None:
            raise UserError(
                f"the card of {model_dir} records no jointly trained forward head",
                hint="retrain the model with the DMU strategy, or set "
                "heads.<name>.options.use_joint_head: false",
            )
        head = cls(dims.in_dim, dims.out_dim, dims.hidden_dim, dims.depth)
        try:
            head.psi.load_state_dict(load_weights(model_dir, card, dims.file))
        except RuntimeError as err:
            raise UserError(
                f"{Path(model_dir) / dims.file} does not match the dimensions in its card: {err}"
            ) from None
        return head.eval()
