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
from modelupgrade.heads.base import HEADS, Head, HeadBatch
from modelupgrade.io import read_json

JOINT_HEAD_FILE = "forward_head.pt"
JOINT_HEAD_CARD_KEY = "forward_head"


class DMUOptions(Section):
    # Wrap the ψ trained jointly with a DMU new model when the model directory has one.
    use_joint_head: bool = True


@HEADS.register("dmu")
class DMUForwardAdapter(Head):
    direction = "forward"
    Options = DMUOptions
    needs_classifier = True
    TRAINING_DEFAULTS = HeadTraining(
        hidden_dim=1024,
        depth=4,
        epochs=30,
        batch_size=512,
        optimizer="sgd",
        lr=0.1,
    )

    def loss(self, batch: HeadBatch) -> torch.Tensor:
        if batch.classifier is None:
            raise UserError("the DMU forward adapter needs the new model's classifier to train")
        return batch.classifier.loss(self(batch.old), batch.labels)

    @staticmethod
    def has_joint_head(model_dir: str | Path) -> bool:
        return (Path(model_dir) / JOINT_HEAD_FILE).is_file()

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
        model_dir = Path(model_dir)
        card_path = model_dir / "card.json"
        if not card_path.is_file():
            raise UserError(
                f"{card_path} does not exist", hint="point --new-model at a trained model directory"
            )
        dims = read_json(card_path).get(JOINT_HEAD_CARD_KEY)
        required = ("in_dim", "out_dim", "hidden_dim", "depth")
        if not isinstance(dims, dict) or any(key not in dims for key in required):
            raise UserError(
                f"{card_path} has no complete {JOINT_HEAD_CARD_KEY!r} entry (needs {', '.join(required)})",
                hint="retrain the model with the DMU strategy, or set heads.<name>.options.use_joint_head: false",
            )
        head = cls(
            int(dims["in_dim"]), int(dims["out_dim"]), int(dims["hidden_dim"]), int(dims["depth"])
        )
        state = torch.load(model_dir / JOINT_HEAD_FILE, map_location="cpu", weights_only=True)
        try:
            head.psi.load_state_dict(state)
        except RuntimeError as err:
            raise UserError(
                f"{model_dir / JOINT_HEAD_FILE} does not match the dimensions in {card_path}: {err}"
            ) from None
        return head.eval()
