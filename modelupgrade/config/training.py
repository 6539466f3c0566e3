"""params.yaml: ``architectures``, ``training`` and ``strategies`` sections."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from modelupgrade.config.base import Section


class ArchitectureParams(Section):
    """An embedding model: a timm backbone (pretrained=False), GeM pooling, linear embedding."""

    backbone: str = "resnet18"
    cifar_stem: bool = True
    embedding_dim: int = Field(default=128, ge=2)
    gem_p: float = Field(default=3.0, gt=0)
    gem_learnable: bool = False
    classifier: Literal["softmax", "arcface", "cosface"] = "arcface"
    scale: float = Field(default=30.0, gt=0)
    margin: float = Field(default=0.3, ge=0)
    backbone_kwargs: dict[str, Any] = Field(default_factory=dict)


class TrainingParams(Section):
    epochs: int = Field(default=2, ge=1)
    batch_size: int = Field(default=256, ge=2)
    lr: float = Field(default=0.1, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=1e-4, ge=0)
    warmup_epochs: float = Field(default=0.2, ge=0)
    lr_min_ratio: float = Field(default=1e-2, ge=0, le=1)
    crop_scale: tuple[float, float] = (0.8, 1.0)
    hflip: bool = True


class StrategyParams(Section):
    """One compatibility strategy: its registered ``kind`` and that kind's hyper-parameters."""

    kind: str
    options: dict[str, Any] = Field(default_factory=dict)
