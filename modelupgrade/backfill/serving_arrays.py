"""The study's arrays of one upgraded system, in the forms the serving modes name.

A mode (``modelupgrade.serving``) names query and gallery forms; the simulator holds each form as an
array of the evaluation split (rows in the split file's order): embeddings of both models and the
outputs of the system's heads. ``systems`` turns a mode's plan into the two query/gallery pairs the
curve engine ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from modelupgrade.backfill.engine import SearchSystems
from modelupgrade.serving.base import Forms, ServingPlan

# Field of ServingArrays that holds each form.
QUERY_FIELDS: dict[str, str] = {
    "new": "new_query",
    "old": "old_query",
    "reverse": "reverse_query",
    "rho": "rho_query",
    "rho_reverse": "rho_reverse_query",
}
GALLERY_FIELDS: dict[str, str] = {
    "stored": "old_gallery",
    "forward": "forward_gallery",
    "new": "new_gallery",
    "rho": "rho_gallery",
}


@dataclass(frozen=True)
class ServingArrays:
    """Embeddings and head outputs of the query and gallery splits (None = not available)."""

    old_query: np.ndarray | None = None  # φ_old(q)
    new_query: np.ndarray | None = None  # φ_new(q)
    old_gallery: np.ndarray | None = None  # φ_old(g), as stored
    new_gallery: np.ndarray | None = None  # φ_new(g), after backfilling
    forward_gallery: np.ndarray | None = None  # ψ(φ_old(g)): forward adapter on stored vectors
    reverse_query: np.ndarray | None = None  # ψ_rev(φ_new(q)): reverse query transform
    rho_query: np.ndarray | None = None  # ρ(φ_new(q)): Seo et al.'s full method
    rho_gallery: np.ndarray | None = None  # ρ(φ_new(g))
    rho_reverse_query: np.ndarray | None = None  # ψ_rev(ρ(φ_new(q)))

    def present(self) -> set[str]:
        return {f.name for f in fields(self) if getattr(self, f.name) is not None}

    def forms(self) -> Forms:
        present = self.present()
        return Forms.of(
            [form for form, name in QUERY_FIELDS.items() if name in present],
            [form for form, name in GALLERY_FIELDS.items() if name in present],
        )

    def systems(self, plan: ServingPlan) -> SearchSystems:
        """The old-part and new-part query/gallery arrays that ``plan`` pairs."""
        return SearchSystems(
            query_old_side=getattr(self, QUERY_FIELDS[plan.old_part.query]),
            gallery_old_side=getattr(self, GALLERY_FIELDS[plan.old_part.gallery]),
            query_new_side=getattr(self, QUERY_FIELDS[plan.new_part.query]),
            gallery_new_side=getattr(self, GALLERY_FIELDS[plan.new_part.gallery]),
        )
