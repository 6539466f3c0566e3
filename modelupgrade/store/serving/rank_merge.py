"""Distance rank merge (RM): the new query searches the backfilled part, ψ_rev(query) the old part,
and the two ranked lists are merged by raw distance; ties go to the new system. Each item sits in
exactly one part, so the merged list never names an item twice.
"""

from __future__ import annotations

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.store.serving.base import SERVING_MODES, Distance, GalleryPart, SearchHits, ServingMode, pairwise_distances, top_k
from modelupgrade.store.spaces import SpaceSpec


@SERVING_MODES.register("rank-merge")
class RankMerge(ServingMode):
    def __init__(self, forward=None, reverse=None) -> None:  # type: ignore[no-untyped-def]
        if forward is not None:
            raise UserError(
                "the rank-merge serving mode transforms the query with a reverse head; it takes no forward head",
                hint="use serving mode 'mixed' with a forward head, or give a reverse head",
            )
        super().__init__(reverse=reverse)

    def _query_for(self, queries: np.ndarray, serving: SpaceSpec, part: GalleryPart) -> np.ndarray:
        if part.space.name == serving.name:
            return queries
        if self.reverse is not None:
            return self._checked(self.reverse(queries), len(queries), part.space.dim, "ψ_rev(query)")
        if serving.backward_compatible and serving.can_replace(part.space.name):
            return queries
        raise UserError(
            f"rank merge needs a reverse head to search space {part.space.name!r} with queries of "
            f"{serving.name!r} (the two are not backward compatible)",
            hint="give a reverse head (rqt, mcl or rm-full) trained for this pair of models",
        )

    def rank(
        self, queries: np.ndarray, serving: SpaceSpec, parts: list[GalleryPart], k: int, distance: Distance
    ) -> SearchHits:
        ids, dists, spaces, priority = [], [], [], []
        rows = np.arange(len(queries))[:, None]
        for part in parts:
            if len(part) == 0:
                continue
            part_distances = pairwise_distances(self._query_for(queries, serving, part), part.read(), distance)
            best = top_k(part_distances, k)
            ids.append(part.item_ids[best])
            dists.append(part_distances[rows, best])
            spaces.append(np.full(best.shape, part.space.name, dtype=object))
            priority.append(np.full(best.shape, 0.0 if part.space.name == serving.name else 1.0))
        if not ids:
            empty = np.empty((len(queries), 0))
            return SearchHits(empty.astype(object), empty.astype(np.float32), empty.astype(object))
        all_ids, all_dists = np.concatenate(ids, axis=1), np.concatenate(dists, axis=1)
        all_spaces, all_priority = np.concatenate(spaces, axis=1), np.concatenate(priority, axis=1)
        order = np.lexsort((all_priority, all_dists), axis=1)[:, :k]
        return SearchHits(all_ids[rows, order], all_dists[rows, order].astype(np.float32), all_spaces[rows, order])
