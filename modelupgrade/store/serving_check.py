"""Whether the serving mode a store is searched in can serve a backfill's target next to its
source while the backfill runs (``ServingCheck``): checked before the backfill changes anything."""

from __future__ import annotations

from dataclasses import dataclass

from modelupgrade.errors import UserError
from modelupgrade.serving.base import QUERY_FORMS, SERVING_MODES, Forms, Pairing, ServingMode
from modelupgrade.store.spaces import SpaceSpec


@dataclass(frozen=True)
class ServingCheck:
    """The serving mode the store is searched in while a backfill runs, and whether the service
    has a forward head ψ: a backfill into a space it cannot serve next to the source space is
    refused before it starts (otherwise every query fails until the backfill ends)."""

    mode: ServingMode
    forward_head: bool = False

    def problem(self, source: SpaceSpec, target: SpaceSpec) -> str | None:
        """Why ``mode`` cannot serve a store half in ``source``, half in ``target``; None if it can.

        Query forms come with each request or from the heads the service is started with, so
        every one is assumed available; the gallery forms are the store's: the stored vectors,
        the target's form, and ψ(stored) with a forward head. ``Searcher`` applies the same rules.
        """
        galleries = {"stored", target.form} | ({"forward"} if self.forward_head else set())
        plan = self.mode.try_plan(Forms.of(QUERY_FORMS, galleries))
        name = self.mode.registry_name
        if plan is None:
            return (
                f"serving mode {name!r} cannot search space {target.name!r}, which will hold "
                f"{target.form!r} vectors ({self.mode.description})"
            )
        if plan.old_part == Pairing("new", "stored") and not target.compares_with_stored(
            source.name
        ):
            return (
                f"model {target.name!r} is not backward compatible with the store's space "
                f"{source.name!r}, so serving mode {name!r} cannot compare its queries with the "
                "items not yet backfilled: every search would fail until the backfill ends"
            )
        return None

    def check(self, source: SpaceSpec, target: SpaceSpec) -> None:
        problem = self.problem(source, target)
        if problem is None:
            return
        working = [
            name
            for name in SERVING_MODES.names()
            if ServingCheck(SERVING_MODES.get(name)()).problem(source, target) is None
        ]
        with_head = (
            not self.forward_head
            and ServingCheck(self.mode, forward_head=True).problem(source, target) is None
        )
        ways = []
        if working:
            ways.append(
                f"serve with {' or '.join(working)} while it runs and say so with --mode "
                f"{working[0]}"
            )
        if with_head:
            ways.append(
                f"serve {self.mode.registry_name} with a forward head ψ {source.name} → "
                f"{target.name} and pass it with --forward-head"
            )
        raise UserError(
            f"{problem}; nothing was changed",
            hint="; or ".join(ways) or "backfill into a space the serving mode can search",
        )
