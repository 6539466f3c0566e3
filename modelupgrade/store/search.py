"""Top-k search over the store at any moment, including while a backfill writes to it.

A search takes one snapshot of the item table (one read transaction: which space holds each item),
then asks the store's vector backend (``modelupgrade.store.backends``) for each part's candidates:
every vector of the part (the embedded store's exact scan) or the few nearest ones its own search
finds (Milvus). The backfill makes rows durable before it points items at them and never rewrites a
committed row, so the vectors read always belong to the snapshot. Snapshots and parts are reused
until the store's commit counter moves.

What meets what is the serving mode's plan (``modelupgrade.serving``): the items of the serving
space are the new part, every other item the old part; the store makes each query and gallery form
the plan names from the query vectors it is given, the stored vectors and the heads. Distances, the
tie rule and top-k are ``modelupgrade.retrieval``'s: a search returns the list the backfill
simulator ranks for the same gallery state.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from modelupgrade.arrays import vector_rows
from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject, json_value
from modelupgrade.retrieval.distance import (
    Distance,
    DistanceBlock,
    check_distance,
    reported_distance,
)
from modelupgrade.retrieval.topk import RankedPart, merged_topk
from modelupgrade.serving.base import Forms, Pairing, ServingMode, ServingPlan
from modelupgrade.store.backends import MatrixGallery, PartGallery
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.matrices import SpaceMatrix
from modelupgrade.store.schema import Snapshot
from modelupgrade.store.spaces import SpaceSpec, TransformFn


@dataclass(frozen=True)
class HeadTransforms:
    """The heads a store serves with, as vectors → vectors callables
    (``store.models`` loads them)."""

    forward: TransformFn | None = None  # ψ: stored old vectors → the new space
    reverse: TransformFn | None = None  # ψ_rev: φ_new(q) → the old space (RQT, MCL)
    rho: TransformFn | None = None  # ρ: φ_new(q) → the full method's space (rm_full)
    rho_reverse: TransformFn | None = None  # ψ_rev∘ρ: φ_new(q) → the old space (rm_full)


@dataclass(frozen=True)
class QueryVectors:
    """Query vectors as a deployment embeds them: ``new`` with the new model (always), and ``old``
    with the old model too when serving by distance rank merge."""

    new: np.ndarray
    old: np.ndarray | None = None


def _loaded(transform: TransformFn | None, name: str) -> TransformFn:
    """A head's transform that a serving plan asks for (it asks only for the heads loaded)."""
    if transform is None:
        raise RuntimeError(f"the serving plan asked for the {name} head, which is not loaded")
    return transform


class HitRecord(TypedDict):
    """One hit as JSON carries it: the item, its distance, the space it was matched in."""

    item_id: str
    distance: float
    space: str


@dataclass
class SearchHits:
    """Top-k per query; row q lists ids, distances and the space each hit was matched in."""

    item_ids: np.ndarray
    distances: np.ndarray
    spaces: np.ndarray

    def records(self) -> list[list[HitRecord]]:
        return [
            [
                HitRecord(item_id=str(item), distance=float(dist), space=str(space))
                for item, dist, space in zip(ids, dists, spaces, strict=True)
            ]
            for ids, dists, spaces in zip(self.item_ids, self.distances, self.spaces, strict=True)
        ]


@dataclass
class _Part:
    space: SpaceSpec
    slots: np.ndarray
    gallery: PartGallery


@dataclass
class _Cached:
    snapshot: Snapshot
    parts: list[_Part]
    # Snapshot position of each slot (hits are ranked by slot, reported by item id and space).
    position: np.ndarray


class Searcher:
    def __init__(
        self,
        store: GalleryStore,
        mode: ServingMode,
        distance: Distance = "cosine",
        heads: HeadTransforms | None = None,
    ) -> None:
        self.store, self.mode, self.distance = store, mode, check_distance(distance)
        self.heads = heads or HeadTransforms()
        self._cached: _Cached | None = None
        self._forward_cache: dict[str, SpaceMatrix] = {}
        self._lock = threading.Lock()

    def _current(self) -> _Cached:
        with self._lock:
            if (
                self._cached is not None
                and self._cached.snapshot.commit_counter == self.store.commit_counter()
            ):
                return self._cached
            snapshot = self.store.snapshot()
            spaces = self.store.spaces()
            parts = []
            for space_name, positions in sorted(snapshot.partitions().items()):
                slots = snapshot.slots[positions]
                rows = snapshot.filters.get(space_name, "")
                gallery = self.store.vectors.part(spaces[space_name], slots, rows)
                parts.append(_Part(spaces[space_name], slots, gallery))
            position = np.zeros(int(snapshot.slots.max(initial=-1)) + 1, dtype=np.int64)
            position[snapshot.slots] = np.arange(len(snapshot.slots))
            self._cached = _Cached(snapshot, parts, position)
            return self._cached

    def snapshot(self) -> Snapshot:
        return self._current().snapshot

    def forms(self, queries: QueryVectors, serving: SpaceSpec) -> Forms:
        heads = self.heads
        query_forms = {"new"} | ({"old"} if queries.old is not None else set())
        query_forms |= {"reverse"} if heads.reverse else set()
        query_forms |= {"rho", "rho_reverse"} if heads.rho and heads.rho_reverse else set()
        return Forms.of(
            query_forms, {"stored", serving.form} | ({"forward"} if heads.forward else set())
        )

    def plan(self, queries: QueryVectors, serving: SpaceSpec) -> ServingPlan:
        return self.mode.plan(self.forms(queries, serving))

    def search(self, queries: QueryVectors | np.ndarray, k: int) -> SearchHits:
        if k < 1:
            raise UserError(f"k must be ≥ 1, got {k}")
        if not isinstance(queries, QueryVectors):
            queries = QueryVectors(np.asarray(queries))
        current = self._current()
        if current.snapshot.serving_space is None:
            raise UserError(
                f"the store at {self.store.path} is empty", hint="ingest a gallery first"
            )
        serving = self.store.space(current.snapshot.serving_space)
        queries = _checked_queries(queries, serving, self.distance)
        plan = self.plan(queries, serving)
        made: dict[str, np.ndarray] = {}
        ranked = []
        for part in current.parts:
            is_new = part.space.name == serving.name
            pairing = plan.new_part if is_new else plan.old_part
            if not is_new:
                self._check_servable(serving, part)
                self._check_comparable(pairing, serving, part.space)
            query = self._query(pairing.query, queries, made, len(queries.new))
            searched = (
                self._forward(part, serving) if pairing.gallery == "forward" else part.gallery
            )
            slots, gallery = searched.nearest(query, k, self.distance)
            distances = DistanceBlock(query, gallery, self.distance)()
            ranked.append(RankedPart(distances, slots, "new" if is_new else "old"))
        top = merged_topk(ranked, k, len(queries.new))
        positions = current.position[top.columns]
        return SearchHits(
            current.snapshot.item_ids[positions],
            reported_distance(top.distances, self.distance),
            current.snapshot.spaces[positions],
        )

    def _query(
        self, form: str, queries: QueryVectors, made: dict[str, np.ndarray], rows: int
    ) -> np.ndarray:
        if form not in made:
            heads = self.heads

            def old_queries() -> np.ndarray:
                # A serving plan asks for the old form only where the queries have one.
                assert queries.old is not None
                return queries.old

            # A plan asks for a head's form only when that head is loaded (not None).
            producers: dict[str, Callable[[], np.ndarray]] = {
                "new": lambda: queries.new,
                "old": old_queries,
                "reverse": lambda: _loaded(heads.reverse, "reverse")(queries.new),
                "rho": lambda: _loaded(heads.rho, "rho")(queries.new),
                "rho_reverse": lambda: _loaded(heads.rho_reverse, "rho_reverse")(queries.new),
            }
            made[form] = vector_rows(producers[form](), f"{form} query vectors", rows=rows)
        return made[form]

    def _forward(self, part: _Part, serving: SpaceSpec) -> PartGallery:
        """ψ(stored vectors) of the part, as a gallery searched exactly in this process."""
        with self._lock:
            matrix = self._forward_cache.get(part.space.storage)
            if matrix is None:
                metric = "l2" if self.distance == "l2" else "ip"
                matrix = SpaceMatrix(serving.dim, metric, self._psi(part.space, serving))
                self._forward_cache[part.space.storage] = matrix
        matrix.cover(
            part.slots,
            lambda slots: self.store.vectors.checksums(part.space, slots),
            part.gallery.vectors,
        )
        return MatrixGallery(matrix, part.slots, matrix.transformed)

    def _psi(self, old: SpaceSpec, serving: SpaceSpec) -> Callable[[np.ndarray], np.ndarray]:
        forward = self.heads.forward
        assert forward is not None

        def psi(rows: np.ndarray) -> np.ndarray:
            result = vector_rows(forward(rows), "ψ(stored vectors)", rows=len(rows))
            if result.shape[1] != serving.dim:
                raise UserError(
                    f"the forward head maps {old.name!r} vectors to {result.shape[1]}-d, but the "
                    f"serving space {serving.name!r} is {serving.dim}-d",
                    hint="the head does not connect the two embedding spaces of this store",
                )
            return result

        return psi

    @staticmethod
    def _check_servable(serving: SpaceSpec, part: _Part) -> None:
        """A store left by an older modelupgrade may hold items in a space its serving space does
        not upgrade from (ingest and rollback refuse to make one now): no mode can rank them."""
        if not serving.serves(part.space.name):
            raise UserError(
                f"{len(part.slots):,} item(s) are in space {part.space.name!r}, which the serving "
                f"space {serving.name!r} does not upgrade from: no serving mode compares them",
                hint=f"backfill the store into {part.space.name!r}, or erase those items and "
                f"ingest them into {serving.name!r}",
            )

    @staticmethod
    def _check_comparable(pairing: Pairing, serving: SpaceSpec, old: SpaceSpec) -> None:
        if pairing == Pairing("new", "stored") and not serving.compares_with_stored(old.name):
            raise UserError(
                f"space {serving.name!r} is not backward compatible with space {old.name!r}, so "
                "new queries cannot be compared with its stored vectors",
                hint="serve with a forward head (mixed), a reverse head (rank-merge-rqt) or the "
                "old model's query vectors (rank-merge)",
            )


def _checked_queries(queries: QueryVectors, serving: SpaceSpec, distance: Distance) -> QueryVectors:
    """The queries as float32 rows of the serving space's width; a zero vector is refused under
    the cosine distance, where it has no direction to rank anything by."""
    new = np.asarray(queries.new)
    if new.ndim == 1:
        new = new[None]
    if new.ndim != 2 or new.shape[1] != serving.dim:
        raise UserError(
            f"query vectors have shape {np.asarray(queries.new).shape}, but the store serves space "
            f"{serving.name!r} with {serving.dim}-d vectors",
            hint=f"embed the queries with the model of {serving.name!r}",
        )
    new = vector_rows(new, "query vectors")
    old = None
    if queries.old is not None:
        old = np.asarray(queries.old)
        old = vector_rows(
            old[None] if old.ndim == 1 else old, "old-model query vectors", rows=len(new)
        )
    if distance == "cosine":
        for what, rows in (("query vectors", new), ("old-model query vectors", old)):
            zero: np.ndarray = (
                np.empty(0, np.int64) if rows is None else np.flatnonzero(~np.any(rows, axis=1))
            )
            if len(zero):
                raise UserError(
                    f"{what}: row {int(zero[0])} is a zero vector, which has no direction to "
                    "rank by under the cosine distance",
                    hint="send the vectors the model gives",
                )
    return QueryVectors(new, old)


def search(
    store: GalleryStore,
    queries: QueryVectors | np.ndarray,
    k: int,
    mode: ServingMode,
    distance: Distance = "cosine",
    heads: HeadTransforms | None = None,
) -> SearchHits:
    """One-shot top-k search (a ``Searcher`` reuses snapshots across calls)."""
    return Searcher(store, mode, distance, heads).search(queries, k)


def index_recall(store: GalleryStore, k: int = 10, queries: int = 32, seed: int = 0) -> JsonObject:
    """recall@``k`` of the store's index against an exact scan, per space of the current snapshot:
    ``queries`` stored vectors of each part, drawn with ``seed``, searched in that part both ways
    and ranked by the shared kernel. Cheap next to the index (a few dozen queries), and on the
    store's own vectors, so it needs no query set; a flat index reads 1.0. A query finds itself,
    which both searches do: it shows what the index loses among the other k − 1. Each space's
    index is given time to settle first (``index_settled``), and whether it had is reported."""
    settings = store.backend_settings
    snapshot = store.snapshot()
    spaces = store.spaces()
    rng = np.random.default_rng(seed)
    recall: dict[str, float] = {}
    settled: dict[str, bool] = {}
    for space_name, positions in sorted(snapshot.partitions().items()):
        spec, slots = spaces[space_name], snapshot.slots[positions]
        settled[space_name] = store.vectors.index_settled(spec)
        sample = np.sort(rng.choice(slots, min(queries, len(slots)), replace=False))
        query = store.vectors.read(spec, sample)
        part = store.vectors.part(spec, slots, snapshot.filters.get(space_name, ""))
        found = []
        for candidates, gallery in (
            part.nearest(query, k, settings.distance),
            (slots, store.vectors.read(spec, slots)),
        ):
            distances = DistanceBlock(query, gallery, settings.distance)()
            found.append(merged_topk([RankedPart(distances, candidates, "new")], k, len(query)))
        approx, exact = (top.columns for top in found)
        hits = [len(set(a) & set(e)) / exact.shape[1] for a, e in zip(approx, exact, strict=True)]
        recall[space_name] = float(np.mean(hits))
    return {
        **settings.index.model_dump(),
        "engine": store.vectors.describe().get("backend", settings.kind),
        f"recall_at_{k}": json_value(recall),
        # False: the index had rows left to build when measured (searched exhaustively meanwhile).
        "index_settled": json_value(settled),
        "recall_queries_per_space": queries,
    }
