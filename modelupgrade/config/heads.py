"""params.yaml: ``heads`` section (forward adapters and reverse query transforms).

``heads`` maps a head name (used in paths: ``heads/<scenario>/<name>-<strategy>``) to one entry: the
head's registered ``kind``, that kind's own ``options``, and overrides of any ``HeadTraining``
field. A field left out (null) takes the default of the paper that defines the kind: each head
class in ``modelupgrade.heads`` holds its paper's settings as a ``HeadTraining``
(``TRAINING_DEFAULTS``). ``HeadTraining`` is the one definition of these fields: the overrides of a
params entry are derived from it. The kind and its options are checked against the head registry
by ``modelupgrade.params``, not here (the config imports none of the library).

``adapters`` lists the training-free adapters the study fits at several sample sizes in one stage
per scenario (``AdapterStudyParams``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, create_model, model_validator

from modelupgrade.config.base import Section


class HeadTraining(Section):
    """How one head is built and trained, every field resolved (a paper's defaults, or those with
    params.yaml's overrides applied)."""

    hidden_dim: int = Field(ge=1)
    depth: int = Field(ge=1)
    epochs: int = Field(ge=1)
    batch_size: int = Field(ge=2)
    optimizer: Literal["sgd", "adam"]
    lr: float = Field(gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=1e-4, ge=0)
    warmup_epochs: float = Field(default=1.0, ge=0)
    warmup_start_ratio: float = Field(default=1e-3, gt=0, le=1)
    lr_min_ratio: float = Field(default=1e-2, ge=0, le=1)
    # Fraction of the epochs after which BatchNorm statistics are frozen (FCT/FastFill: 0.5);
    # 1 = never.
    freeze_bn_after: float = Field(default=1.0, gt=0, le=1)
    # BiCT momentum refinement: input of generation i's head is (1 - m)·F_{i-1} + m·F_{i-2}.
    input_momentum: float = Field(default=0.0, ge=0, le=1)

    @classmethod
    def adam(cls, **fields: Any) -> HeadTraining:
        """Adam without weight decay or warm-up, cosine to zero (Seo et al.'s reverse transforms,
        the residual MLP adapter); ``fields`` give the rest and may replace any of these."""
        return cls.model_validate(
            {"optimizer": "adam", "weight_decay": 0.0, "warmup_epochs": 0.0, "lr_min_ratio": 0.0}
            | fields
        )

    @classmethod
    def from_defaults(cls, defaults: HeadTraining, **overrides: Any) -> HeadTraining:
        """``defaults`` with some fields replaced, checked like any other ``HeadTraining``."""
        return cls.model_validate({**defaults.model_dump(), **overrides})

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump()


def _optional_fields(section: type[Section]) -> dict[str, Any]:
    """Every field of ``section`` made optional (None = not given), with the same checks."""
    fields = {}
    for name, field in section.model_fields.items():
        assert field.annotation is not None  # every field of a Section is annotated
        checked = (
            Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
        )
        fields[name] = (checked | None, None)
    return fields


# One optional override per ``HeadTraining`` field: a new training field is a params key at once.
HeadTrainingOverrides: type[Section] = create_model(
    "HeadTrainingOverrides",
    __base__=Section,
    __doc__="Overrides of a head kind's paper defaults; None keeps the default.",
    **_optional_fields(HeadTraining),
)


# HeadTrainingOverrides is built at run time (create_model): to mypy a variable, not a class.
class HeadParams(HeadTrainingOverrides):  # type: ignore[misc,valid-type]
    """One entry of ``heads``: a head kind, its options, and overrides of its paper's training."""

    # A name in modelupgrade.heads.HEADS; ``options`` are that kind's own hyper-parameters.
    kind: str
    options: dict[str, Any] = Field(default_factory=dict)

    def training_overrides(self) -> dict[str, Any]:
        """The ``HeadTraining`` fields this entry sets."""
        return {
            name: getattr(self, name)
            for name in HeadTraining.model_fields
            if getattr(self, name) is not None
        }


# A sample size of the adapter study: a number of pairs, or every pair of the training split.
SampleSize = Annotated[int, Field(ge=2)] | Literal["all"]
ALL_SIZES: Literal["all"] = "all"  # the sample size of the whole training split


def _every_row() -> list[SampleSize]:
    return [ALL_SIZES]


class AdapterStudyParams(Section):
    """``adapters``: the training-free adapters the study fits (Drift-Adapter's Procrustes,
    low-rank affine and residual MLP in both directions, SLERP on the query side), every entry at
    every sample size, all in one stage per scenario (``adapters@<scenario>`` in dvc.yaml).

    Each fit is saved as a head ``heads/<sc>/adapters-<strategy>/<entry>.<size>-<strategy>`` (size
    ``n1000`` or ``all``), with its outputs on the evaluation embeddings beside the other heads'.
    """

    # Scenario → the strategy whose new model the adapters map to and from (its new_train
    # embeddings pair with gen0's, row by row).
    scenarios: dict[str, str] = Field(default_factory=dict)
    # How many paired training embeddings each adapter is fitted on, a nested random sample (each
    # smaller sample is part of the larger ones); "all" = the whole training split. A number at or
    # above the split's size is skipped (the fit on "all" covers it).
    sample_sizes: list[SampleSize] = Field(default_factory=_every_row, min_length=1)
    # The adapters, as ``heads`` entries: a training-free head kind, its options, and for the
    # iterative ones (residual MLP) overrides of its training.
    heads: dict[str, HeadParams] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _sizes_distinct(self) -> AdapterStudyParams:
        if len(set(self.sample_sizes)) != len(self.sample_sizes):
            raise ValueError(f"sample_sizes lists a size twice: {self.sample_sizes}")
        if self.scenarios and not self.heads:
            raise ValueError("scenarios are listed but no adapter is defined under 'heads'")
        return self

    def ordered_sizes(self) -> list[int | Literal["all"]]:
        """The sample sizes, smallest first, ``all`` last."""
        numbers: list[int | Literal["all"]] = sorted(
            size for size in self.sample_sizes if isinstance(size, int)
        )
        return numbers + ([ALL_SIZES] if ALL_SIZES in self.sample_sizes else [])
