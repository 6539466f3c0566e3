"""Classifier heads over L2-normalised features: normalised softmax, ArcFace and CosFace.

All three hold a bias-free prototype matrix W (C × d) and produce logits from the cosine between the
normalised feature and the normalised prototypes. ``logits(features, labels)`` applies the margin to
the target column (training); ``cosine(features)`` gives margin-free similarities (confidence,
entropy, inference). Papers' defaults: ArcFace s = 30, m = 0.3 for landmarks; s = 64, m = 0.5 faces.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from modelupgrade.plugins import Registry

CLASSIFIERS: Registry[MarginClassifier] = Registry("classifier")

# acos has infinite slope at ±1; clamping keeps gradients finite.
_COS_EPS = 1e-7


class MarginClassifier(nn.Module):
    """Base: cosine logits scaled by ``scale``; subclasses add their margin to the target class."""

    registry_name: ClassVar[str]  # set by CLASSIFIERS.register
    # The kind's defaults, for ``scale`` and ``margin`` left out.
    default_scale: ClassVar[float] = 30.0
    default_margin: ClassVar[float] = 0.0

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        scale: float | None = None,
        margin: float | None = None,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_classes, embedding_dim))
        nn.init.normal_(self.weight, std=0.01)
        self.scale = float(self.default_scale if scale is None else scale)
        self.margin = float(self.default_margin if margin is None else margin)

    @property
    def num_classes(self) -> int:
        return self.weight.shape[0]

    def cosine(self, features: torch.Tensor) -> torch.Tensor:
        """Cosine similarity of each feature to each class prototype, shape (N, C), in float32.

        Autocast is switched off here: the margins work on cosines near ±1 (acos, a 1e-7 clamp),
        where bf16's three significant digits would erase them.
        """
        with torch.autocast(features.device.type, enabled=False):
            return F.linear(
                F.normalize(features.float(), dim=-1), F.normalize(self.weight.float(), dim=-1)
            )

    def logits(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        cos = self.cosine(features)
        if labels is not None and self.margin != 0.0:
            cos = self.apply_margin(cos, labels)
        return self.scale * cos

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.logits(features, labels)

    def apply_margin(self, cos: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return cos

    def loss(
        self, features: torch.Tensor, labels: torch.Tensor, reduction: str = "mean"
    ) -> torch.Tensor:
        return F.cross_entropy(self.logits(features, labels), labels, reduction=reduction)

    def extra_repr(self) -> str:
        return (
            f"classes={self.num_classes}, dim={self.weight.shape[1]}, "
            f"s={self.scale}, m={self.margin}"
        )


@CLASSIFIERS.register("softmax")
class NormSoftmax(MarginClassifier):
    """Normalised softmax: scaled cosine logits without a margin."""

    default_scale = 16.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.margin = 0.0  # none, whatever is asked


@CLASSIFIERS.register("arcface")
class ArcFace(MarginClassifier):
    """Additive angular margin: the target logit is s·cos(θ_y + m)."""

    default_margin = 0.3

    def apply_margin(self, cos: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        target = cos.gather(1, labels[:, None]).clamp(-1 + _COS_EPS, 1 - _COS_EPS)
        theta = torch.acos(target)
        # Beyond π - m, cos(θ + m) would increase again; keep the logit monotone in θ.
        with_margin = torch.where(
            theta + self.margin < math.pi, torch.cos(theta + self.margin), target - 1 - self.margin
        )
        return cos.scatter(1, labels[:, None], with_margin)


@CLASSIFIERS.register("cosface")
class CosFace(MarginClassifier):
    """Additive cosine margin: the target logit is s·(cos θ_y − m)."""

    default_margin = 0.35

    def apply_margin(self, cos: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        target = cos.gather(1, labels[:, None])
        return cos.scatter(1, labels[:, None], target - self.margin)


def build_classifier(
    kind: str, embedding_dim: int, num_classes: int, scale: float, margin: float
) -> MarginClassifier:
    return CLASSIFIERS.get(kind)(embedding_dim, num_classes, scale=scale, margin=margin)
