"""params.yaml: ``heads`` section (forward adapters and reverse query transforms).

``heads`` maps a head name (used in paths: ``heads/<scenario>/<name>-<strategy>``) to one entry. Every
training field left out (null) takes the default of the paper that defines the head's ``kind``
(see ``TRAINING_DEFAULTS`` on each head class in ``modelupgrade.heads``); ``options`` are the kind's
own hyper-parameters, validated strictly against that kind's options schema.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from modelupgrade.config.base import Section


class HeadParams(Section):
    kind: str
    hidden_dim: int | None = Field(default=None, ge=1)
    depth: int | None = Field(default=None, ge=1)
    epochs: int | None = Field(default=None, ge=1)
    batch_size: int | None = Field(default=None, ge=2)
    optimizer: Literal["sgd", "adam"] | None = None
    lr: float | None = Field(default=None, gt=0)
    momentum: float | None = Field(default=None, ge=0, lt=1)
    weight_decay: float | None = Field(default=None, ge=0)
    warmup_epochs: float | None = Field(default=None, ge=0)
    warmup_start_ratio: float | None = Field(default=None, gt=0, le=1)
    lr_min_ratio: float | None = Field(default=None, ge=0, le=1)
    # Fraction of the epochs after which BatchNorm statistics are frozen (FCT/FastFill: 0.5); 1 = never.
    freeze_bn_after: float | None = Field(default=None, gt=0, le=1)
    # BiCT momentum refinement: input of generation i's head is (1 - m)·F_{i-1} + m·F_{i-2}.
    input_momentum: float = Field(default=0.0, ge=0, le=1)
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _kind_and_options_are_known(self) -> HeadParams:
        # Imported here: the heads package imports this module's siblings, not the other way round.
        from modelupgrade.errors import UserError
        from modelupgrade.heads.base import HEADS

        try:
            head_class = HEADS.get(self.kind)
        except UserError as err:
            raise ValueError(str(err)) from None
        try:
            head_class.Options.model_validate(self.options)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']}" for e in err.errors()
            )
            raise ValueError(f"options of head kind {self.kind!r} are not valid: {problems}") from None
        return self
