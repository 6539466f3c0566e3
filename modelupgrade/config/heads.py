"""params.yaml: ``heads`` section (forward adapters and reverse query transforms).

``heads`` maps a head name (used in paths: ``heads/<scenario>/<name>-<strategy>``) to one entry: the
head's registered ``kind``, that kind's own ``options``, and overrides of any ``HeadTraining``
field. A field left out (null) takes the default of the paper that defines the kind: each head
class in ``modelupgrade.heads`` holds its paper's settings as a ``HeadTraining``
(``TRAINING_DEFAULTS``). ``HeadTraining`` is the one definition of these fields: the overrides of a
params entry are derived from it. The kind and its options are checked against the head registry
by ``modelupgrade.plugins``, not here (the config imports none of the library).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, create_model

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
    def from_defaults(cls, defaults: HeadTraining, **overrides: Any) -> HeadTraining:
        """``defaults`` with some fields replaced, checked like any other ``HeadTraining``."""
        return cls.model_validate({**defaults.model_dump(), **overrides})

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump()


def _optional_fields(section: type[Section]) -> dict[str, Any]:
    """Every field of ``section`` made optional (None = not given), with the same checks."""
    fields = {}
    for name, field in section.model_fields.items():
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
