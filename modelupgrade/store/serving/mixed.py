"""Mixed index (FCT/FastFill/BCT serving): the new query against one gallery that holds new vectors
for backfilled items and, for the rest, the old vectors — as they are when the new model is backward
compatible, or mapped by a forward head ψ(old) otherwise.
"""

from __future__ import annotations

import threading

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.store.serving.base import SERVING_MODES, Distance, GalleryPart, SearchHits, ServingMode, pairwise_distances, top_k
from modelupgrade.store.spaces import SpaceSpec


@SERVING_MODES.register("mixed")
class MixedIndex(ServingMode):
    def __init__(self, forward=None, reverse=None) -> None:  # type: ignore[no-untyped-def]
        if reverse is not None:
            raise UserError(
                "the mixed serving mode maps the stored old vectors with a forward head; it takes no reverse head",
                hint="use serving mode 'rank-merge' with a reverse head, or give a forward head",
            )
        super().__init__(forward=forward)
        # Old vectors never change once stored, so ψ(old) is computed once per slot and reused.
        self._mapped: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._lock = threading.Lock()

    def _gallery_vectors(self, part: GalleryPart, serving: SpaceSpec) -> np.ndarray:
        if part.space.name == serving.name:
            return part.read()
        if self.forward is not None:
            return self._mapped_vectors(part, serving)
        if serving.backward_compatible and serving.can_replace(part.space.name):
            return part.read()
        raise UserError(
            f"space {serving.name!r} is not backward compatible with space {part.space.name!r}, so new "
            "queries cannot be compared with its stored vectors",
            hint="serve with a forward head (mixed), or with a reverse head (serving mode 'rank-merge')",
        )

    def _mapped_vectors(self, part: GalleryPart, serving: SpaceSpec) -> np.ndarray:
        with self._lock:
            table, mapped = self._mapped.get(
                part.space.name, (np.empty((0, serving.dim), np.float32), np.empty(0, dtype=bool))
            )
            size = max(len(table), int(part.slots.max()) + 1 if len(part.slots) else 0)
            if size > len(table):
                table = np.concatenate([table, np.zeros((size - len(table), serving.dim), np.float32)])
                mapped = np.concatenate([mapped, np.zeros(size - len(mapped), dtype=bool)])
            todo = ~mapped[part.slots]
            if todo.any():
                stored = part.read()[todo]
                table[part.slots[todo]] = self._checked(self.forward(stored), len(stored), serving.dim, "ψ(old vectors)")
                mapped[part.slots[todo]] = True
            self._mapped[part.space.name] = (table, mapped)
            return table[part.slots]

    def rank(
        self, queries: np.ndarray, serving: SpaceSpec, parts: list[GalleryPart], k: int, distance: Distance
    ) -> SearchHits:
        gallery = np.concatenate([self._gallery_vectors(p, serving) for p in parts]) if parts else np.empty((0, serving.dim), np.float32)
        item_ids = np.concatenate([p.item_ids for p in parts]) if parts else np.empty(0, dtype=object)
        spaces = np.concatenate([np.full(len(p), p.space.name, dtype=object) for p in parts]) if parts else np.empty(0, dtype=object)
        distances = pairwise_distances(queries, gallery, distance)
        # Ties favour the serving space's own vectors.
        tie_break = np.where(spaces == serving.name, 0.0, 1.0) if len(spaces) else None
        best = top_k(distances, k, tie_break)
        rows = np.arange(len(queries))[:, None]
        return SearchHits(item_ids[best], distances[rows, best].astype(np.float32), spaces[best])
