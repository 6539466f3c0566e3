"""params.yaml: ``dataset``, ``scenarios``, ``evaluation_split`` and ``sequential`` sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from modelupgrade.config.base import Section

ScenarioKind = Literal["extended-data", "open-data", "extended-class", "open-class", "identical-data"]


class DatasetParams(Section):
    name: str = "fashion-mnist"
    loader: Literal["idx", "imagefolder", "manifest", "cifar100", "gldv2"] = "idx"
    root: str = "/usr/share/datasets/fashion-mnist"
    # Cap per class of the training pool (None = all); keeps the CPU default inside its time budget.
    max_train_per_class: int | None = Field(default=None, ge=1)
    min_images_per_class: int = Field(default=20, ge=1)


class ScenarioParams(Section):
    kind: ScenarioKind
    # extended-/open-data: fraction of each class's images; extended-/open-class: fraction of classes.
    old_fraction: float = Field(default=0.3, gt=0.0, lt=1.0)
    old_architecture: str = "default"
    new_architecture: str = "default"
    # Strategies whose new generation is trained on this scenario (names of ``strategies`` entries).
    strategies: list[str] = Field(default_factory=lambda: ["independent", "bct", "dmu"])


class EvaluationSplitParams(Section):
    """Query and gallery come from the held-out source split, disjoint from every training set."""

    source_split: str = "test"
    queries_per_class: int = Field(default=100, ge=1)
    gallery_per_class: int | None = Field(default=None, ge=1)


class SequentialParams(Section):
    """Growing data snapshots for generation-over-generation upgrades (25% → 50% → 100%)."""

    fractions: list[float] = Field(default_factory=lambda: [0.25, 0.5, 1.0])
    strategies: list[str] = Field(default_factory=lambda: ["bct", "bict", "dmu"])
