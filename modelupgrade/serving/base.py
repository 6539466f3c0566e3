"""Serving modes: how a query meets a gallery that is partly old, partly new.

While a backfill runs, each gallery item is in one of two parts: the *old part* still holds the
vector the old model stored, the *new part* holds its vector in the new space. A serving mode says,
for each part, which form of the query searches which form of the gallery; the two result lists are
ranked together by raw distance under ``modelupgrade.retrieval.topk``'s tie rule. Forms:

- query: ``new`` φ_new(q), ``old`` φ_old(q), ``reverse`` ψ_rev(φ_new(q)) (a reverse head), ``rho``
  ρ(φ_new(q)) and ``rho_reverse`` ψ_rev(ρ(φ_new(q))) (Seo et al.'s full method, an rm_full head);
- gallery: ``stored`` the old vector as stored, ``forward`` ψ(stored) (a forward head), ``new``
  φ_new(g), ``rho`` ρ(φ_new(g)).

A mode only names forms; the simulator (``modelupgrade.backfill``) reads them from the study's
arrays, the store (``modelupgrade.store``) computes them from stored vectors, query vectors and
heads. The same mode therefore serves the same pairs in both.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import ClassVar, Literal

from modelupgrade.errors import UserError
from modelupgrade.plugins import Registry

QueryForm = Literal["new", "old", "reverse", "rho", "rho_reverse"]
GalleryForm = Literal["stored", "forward", "new", "rho"]
QUERY_FORMS: tuple[str, ...] = ("new", "old", "reverse", "rho", "rho_reverse")
GALLERY_FORMS: tuple[str, ...] = ("stored", "forward", "new", "rho")


@dataclass(frozen=True)
class Pairing:
    """The query form that searches one part of the gallery, and the gallery form it meets there."""

    query: QueryForm
    gallery: GalleryForm


@dataclass(frozen=True)
class ServingPlan:
    """What a mode serves: the pairing of the not-yet-backfilled part and of the backfilled part."""

    mode: str
    old_part: Pairing
    new_part: Pairing

    @property
    def one_index(self) -> bool:
        """The same query searches both parts: one mixed index (a single search per query)."""
        return self.old_part.query == self.new_part.query


@dataclass(frozen=True)
class Forms:
    """The query and gallery forms a serving system can produce."""

    queries: frozenset[str]
    galleries: frozenset[str]

    @classmethod
    def of(cls, queries: Collection[str], galleries: Collection[str]) -> Forms:
        return cls(frozenset(queries), frozenset(galleries))

    def has(self, pairing: Pairing) -> bool:
        return pairing.query in self.queries and pairing.gallery in self.galleries


class ServingMode:
    registry_name: ClassVar[str]
    description: ClassVar[str] = ""
    # Pairings of the old part, in order of preference; the first the system can produce is served.
    old_part: ClassVar[tuple[Pairing, ...]]
    new_part: ClassVar[Pairing] = Pairing("new", "new")

    def plan(self, forms: Forms) -> ServingPlan:
        """The pairings this mode serves with ``forms``, or a ``UserError``
        naming what is missing."""
        found = self.try_plan(forms)
        if found is None:
            raise UserError(
                f"serving mode {self.registry_name!r} lacks what it needs", hint=self.description
            )
        return found

    def try_plan(self, forms: Forms) -> ServingPlan | None:
        if not forms.has(self.new_part):
            return None
        for pairing in self.old_part:
            if forms.has(pairing):
                return ServingPlan(self.registry_name, pairing, self.new_part)
        return None

    def available(self, forms: Forms) -> bool:
        return self.try_plan(forms) is not None


SERVING_MODES: Registry[ServingMode] = Registry("serving mode")


def build_serving_mode(name: str) -> ServingMode:
    return SERVING_MODES.get(name)()
