"""params.yaml: ``dataset``, ``scenarios``, ``evaluation_split`` and ``sequential`` sections."""

from __future__ import annotations

from itertools import pairwise
from typing import Literal

from pydantic import Field, field_validator

from modelupgrade.config.base import Section

ScenarioKind = Literal[
    "extended-data", "open-data", "extended-class", "open-class", "identical-data"
]


class Gldv2Params(Section):
    """File names of the GLDv2 retrieval layout (only read when ``dataset.loader`` is ``gldv2``)."""

    # Either GLDv2's ``train.csv`` (id,url,landmark_id) or ``train_clean.csv`` (landmark_id,images).
    train_csv: str = "train_clean.csv"
    train_images_dir: str = "train"
    # Revisited Oxford/Paris sets, each at <root>/<name>/gnd_<name>.pkl with images in <name>/jpg/.
    revisited_sets: list[str] = Field(default_factory=lambda: ["roxford5k", "rparis6k"])


class DatasetParams(Section):
    name: str = "fashion-mnist"
    # A registered dataset loader (``modelupgrade.data.loaders``; modelupgrade.params checks it).
    loader: str = "idx"
    root: str = "/usr/share/datasets/fashion-mnist"
    # Names of the classes in label order; None = the known names of ``name`` or "0".."C-1".
    class_names: list[str] | None = None
    # The source split the training pool is drawn from.
    train_split: str = "train"
    # File datasets (imagefolder, manifest, gldv2) are resized to image_size x image_size RGB;
    # array datasets (IDX, CIFAR) keep their native size.
    image_size: int = Field(default=64, ge=8)
    # ``manifest`` loader: a CSV or parquet file with columns path,label[,split], relative to root.
    manifest_file: str = "manifest.csv"
    gldv2: Gldv2Params = Field(default_factory=Gldv2Params)
    # Cap per class of the training pool (None = all); keeps the CPU default inside its time budget.
    max_train_per_class: int | None = Field(default=None, ge=1)
    min_images_per_class: int = Field(default=20, ge=1)


class ScenarioParams(Section):
    kind: ScenarioKind
    # extended-/open-data: fraction of each class's images; extended-/open-class:
    # fraction of classes.
    old_fraction: float = Field(default=0.3, gt=0.0, lt=1.0)
    old_architecture: str = "default"
    new_architecture: str = "default"
    # Strategies whose new generation is trained on this scenario (names of ``strategies`` entries).
    strategies: list[str] = Field(default_factory=lambda: ["independent", "bct", "dmu"])
    # Heads trained on this scenario: head name (an entry of ``heads``) → the strategy whose new
    # model it pairs with (one of ``strategies``); the head lives in
    # heads/<scenario>/<head>-<strategy>.
    heads: dict[str, str] = Field(default_factory=dict)


class StudyParams(Section):
    """What the study runs: DVC's per-scenario stages iterate ``scenarios`` (names under
    ``scenarios``), the sequential chains' shared stages ``sequential`` (``[sequential]`` runs the
    chains, ``[]`` does not). A scenario defined but not run trains nothing (no strategies, no
    heads), since dvc.yaml makes its strategy and head stages from those lists."""

    scenarios: list[str] = Field(min_length=1)
    sequential: list[Literal["sequential"]] = Field(default_factory=list, max_length=1)


class EvaluationSplitParams(Section):
    """Query and gallery come from the held-out source split, disjoint from every training set.

    ``sampled``: per class, ``queries_per_class`` queries; the rest (or ``gallery_per_class`` of it)
    is the gallery. ``leave-one-out``: query set = gallery set, each query excluded from its own
    ranking by the evaluator. ``predefined``: the manifest's rows with source_split ``query`` and
    ``gallery`` (retrieval protocols such as Revisited Oxford/Paris).
    """

    protocol: Literal["sampled", "leave-one-out", "predefined"] = "sampled"
    source_split: str = "test"
    # When set, the evaluation pool is this per-class fraction of the training source split
    # (datasets without a held-out split); it is removed from the training pool.
    holdout_fraction: float | None = Field(default=None, gt=0.0, lt=1.0)
    queries_per_class: int = Field(default=100, ge=1)
    gallery_per_class: int | None = Field(default=None, ge=1)


class SequentialParams(Section):
    """Growing snapshots for generation-over-generation upgrades (25% → 50% → 100%), nested."""

    # ``data``: per-class fraction of each class's images; ``class``: fraction of the classes.
    kind: Literal["data", "class"] = "data"
    fractions: list[float] = Field(default_factory=lambda: [0.25, 0.5, 1.0])
    strategies: list[str] = Field(default_factory=lambda: ["bct", "bict", "dmu"])
    # Chain strategy → head entry: a forward head ψ_i trained at every generation i ≥ 1 of that
    # chain on the chain's refreshed gallery F_{i−1} (BiCT's recurrent stage 2; momentum from the
    # head entry's input_momentum), written to embeddings/sequential/<strategy>/gen<i>-psi.
    heads: dict[str, str] = Field(default_factory=dict)

    @field_validator("fractions")
    @classmethod
    def _growing_fractions(cls, fractions: list[float]) -> list[float]:
        if len(fractions) < 2:
            raise ValueError("needs at least two snapshots (gen0 and gen1)")
        if any(not 0.0 < f <= 1.0 for f in fractions):
            raise ValueError("every fraction must lie in (0, 1]")
        if any(b <= a for a, b in pairwise(fractions)):
            raise ValueError("fractions must grow strictly (each snapshot contains the one before)")
        return fractions
