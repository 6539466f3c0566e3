"""Embedding spaces: one per model generation whose vectors the store holds.

A space is named after the model version that produced its vectors. ``upgrades_from`` lists the
spaces a model of this space was trained to replace (its parent generation, and for a sequential
chain every ancestor it stays comparable with); a backfill into this space may only start from one
of them. ``backward_compatible`` says whether its queries may be compared directly with vectors of
those spaces (BCT-style training); an independently trained model needs a transformation instead.
``form`` says which embedding of the new model the space holds (``modelupgrade.serving``'s gallery
forms): the model's own (``new``), or ρ of it (``rho``: Seo et al.'s full method, written through an
rm_full head), which only the ``rank-merge-full`` serving mode searches. ``storage`` is where a
registered space's vectors live in the vector backend (``schema``); a spec not yet registered has
none.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from modelupgrade.errors import UserError

# A map of vector rows from one space to another: a head's ψ, ψ_rev or ρ, applied to (N, d) rows.
TransformFn = Callable[[np.ndarray], np.ndarray]

_SPACE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class SpaceSpec:
    name: str
    dim: int
    upgrades_from: tuple[str, ...] = field(default_factory=tuple)
    backward_compatible: bool = False
    model_ref: str = ""
    form: Literal["new", "rho"] = "new"
    storage: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not _SPACE_NAME.match(self.name):
            raise UserError(
                f"embedding space name {self.name!r} is not allowed",
                hint="use letters, digits, '.', '_' or '-' (it names the model "
                "version, e.g. gen1-bct)",
            )
        if self.dim < 1:
            raise UserError(
                f"embedding space {self.name!r} must have a positive dimension, got {self.dim}"
            )
        if self.form not in ("new", "rho"):
            raise UserError(
                f"embedding space {self.name!r} has form {self.form!r}; it must be 'new' or 'rho'"
            )
        object.__setattr__(self, "upgrades_from", tuple(self.upgrades_from))

    def can_replace(self, space: str) -> bool:
        return space in self.upgrades_from

    def serves(self, space: str) -> bool:
        """Whether a store serving this space can search items held in ``space``: its own, or one
        it upgrades from (through a head, or as stored for a backward-compatible model). No
        serving mode compares this space's queries with a later or unrelated model's vectors."""
        return space == self.name or self.can_replace(space)

    def compares_with_stored(self, space: str) -> bool:
        """Whether queries of this space may meet the vectors of ``space`` as they are stored: its
        model was trained backward compatible with that space's."""
        return self.backward_compatible and self.can_replace(space)
