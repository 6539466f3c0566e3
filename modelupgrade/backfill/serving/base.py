"""Serving modes: how a query meets a gallery that is partly old, partly new.

A mode only chooses vectors; heads are applied outside (``ServingArrays`` holds their outputs), and
every mode reduces to ``SearchSystems``: the query/gallery vectors of the not-yet-backfilled part
and of the backfilled part, ranked together by raw distance.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

from modelupgrade.backfill.engine import SearchSystems
from modelupgrade.errors import UserError
from modelupgrade.registry_util import Registry


@dataclass(frozen=True)
class ServingArrays:
    """Embeddings and head outputs of the query and gallery splits (None = not available)."""

    old_query: np.ndarray | None = None             # φ_old(q)
    new_query: np.ndarray | None = None             # φ_new(q)
    old_gallery: np.ndarray | None = None           # φ_old(g), as stored
    new_gallery: np.ndarray | None = None           # φ_new(g), after backfilling
    forward_gallery: np.ndarray | None = None       # ψ(φ_old(g)): forward adapter on stored vectors
    reverse_query: np.ndarray | None = None         # ψ_rev(φ_new(q)): reverse query transform
    rho_query: np.ndarray | None = None             # ρ(φ_new(q)): Seo et al.'s full method
    rho_gallery: np.ndarray | None = None           # ρ(φ_new(g))
    rho_reverse_query: np.ndarray | None = None     # ψ_rev(ρ(φ_new(q)))

    def present(self) -> set[str]:
        return {f.name for f in fields(self) if getattr(self, f.name) is not None}


class ServingMode:
    registry_name: ClassVar[str]
    description: ClassVar[str] = ""
    # Alternatives: each inner tuple is one acceptable set of ServingArrays fields.
    requires: ClassVar[tuple[tuple[str, ...], ...]] = ()

    def available(self, arrays: ServingArrays) -> bool:
        present = arrays.present()
        return any(set(option) <= present for option in self.requires)

    def systems(self, arrays: ServingArrays) -> SearchSystems:
        if not self.available(arrays):
            raise UserError(f"serving mode {self.registry_name!r} needs arrays this simulation lacks",
                            hint=self.description)
        return self._systems(arrays)

    def _systems(self, arrays: ServingArrays) -> SearchSystems:
        raise NotImplementedError

    def old_state_gallery(self, arrays: ServingArrays) -> np.ndarray:
        """What an un-backfilled item serves (for the oracle order and the t = 0 identity)."""
        return self.systems(arrays).gallery_old_side


SERVING_MODES: Registry[ServingMode] = Registry("backfill serving mode")


def build_serving_mode(name: str) -> ServingMode:
    return SERVING_MODES.get(name)()
