"""Operations that serve a store: search it, and step it between spaces after a backfill (cutover
with its shadow evaluation, rollback, cleanup)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from modelupgrade.arrays import load_array
from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.retrieval.distance import Distance
from modelupgrade.serving import build_serving_mode
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.search import (
    HeadTransforms,
    HitRecord,
    QueryVectors,
    Searcher,
    SearchHits,
)
from modelupgrade.store.steps import ServingStep


@dataclass(frozen=True)
class SearchRequest:
    """Queries for a store: query vectors (and, for rank-merge, the old model's), or items by
    id (query by example), searched in ``mode`` for ``k`` hits each."""

    store: Path
    mode: str
    k: int
    distance: Distance
    queries: Path | None = None
    old_queries: Path | None = None
    rows: str | None = None
    item_ids: tuple[str, ...] = ()


class QueryHits(TypedDict):
    """One query's hits as ``--json`` shows them."""

    query: str
    hits: list[HitRecord]


@dataclass
class SearchResult:
    """Hits of each query, labelled as the command line named the queries."""

    queries: list[str]
    hits: SearchHits

    def as_dict(self) -> list[QueryHits]:
        return [
            {"query": q, "hits": r} for q, r in zip(self.queries, self.hits.records(), strict=True)
        ]

    def describe(self) -> str:
        lines = []
        for query, row in zip(self.queries, self.hits.records(), strict=True):
            lines.append(f"query {query}:")
            lines += [
                f"  {rank:3d}. {hit['item_id']:<24} distance={hit['distance']:<11.4g}  "
                f"space={hit['space']}"
                for rank, hit in enumerate(row, 1)
            ]
        return "\n".join(lines)


def row_range(rows: str | None, count: int) -> slice:
    """The rows ``--rows`` names: ``I`` is row I alone, ``START:STOP`` rows START … STOP − 1 (both
    ends given, counted from 0, as in Python)."""
    if rows is None:
        return slice(None)
    start, sep, stop = rows.partition(":")
    try:
        first = int(start)
        last = int(stop) if sep else first + 1
    except ValueError:
        raise UserError(
            f"--rows {rows!r} is not a row number I or a range START:STOP",
            hint="e.g. --rows 3 (row 3 alone) or --rows 0:5 (rows 0 to 4)",
        ) from None
    if not 0 <= first < last <= count:
        raise UserError(
            f"--rows {rows!r} selects no rows of the {count} query vectors",
            hint=f"rows are numbered 0 to {count - 1}; START:STOP stops before STOP",
        )
    return slice(first, last)


def search(request: SearchRequest, heads: HeadTransforms) -> SearchResult:
    """Top-k items for each query, naming the space each hit came from."""
    if request.k < 1:
        raise UserError(
            f"--k must be at least 1, got {request.k}", hint="--k is the hits per query"
        )
    with GalleryStore.open(request.store) as gallery:
        searcher = Searcher(
            gallery,
            build_serving_mode(request.mode),
            request.distance,
            heads,
        )
        if request.queries is not None:
            vectors = load_array(request.queries, "query vectors")
            chosen = row_range(request.rows, len(vectors))
            old = (
                None
                if request.old_queries is None
                else load_array(request.old_queries, "old-model query vectors")[chosen]
            )
            labels = [f"row {i}" for i in range(len(vectors))[chosen]]
            query = QueryVectors(vectors[chosen], old)
        elif request.item_ids:
            query, labels = _by_example(gallery, searcher, request.item_ids)
        else:
            raise UserError("give --queries (a .npy of query vectors) or --item-id")
        return SearchResult(labels, searcher.search(query, request.k))


def _by_example(
    gallery: GalleryStore, searcher: Searcher, item_ids: Sequence[str]
) -> tuple[QueryVectors, list[str]]:
    snapshot = searcher.snapshot()
    position = {str(i): p for p, i in enumerate(snapshot.item_ids)}
    unknown = [i for i in item_ids if i not in position]
    if unknown:
        raise UserError(f"unknown item id(s): {', '.join(unknown)}")
    stale = [i for i in item_ids if snapshot.spaces[position[i]] != snapshot.serving_space]
    if stale:
        raise UserError(
            f"item(s) {', '.join(stale)} are not backfilled into {snapshot.serving_space!r} yet",
            hint="query by example needs a vector in the serving space; pass --queries instead",
        )
    slots = np.array([snapshot.slots[position[i]] for i in item_ids])
    vectors = gallery.read_vectors(str(snapshot.serving_space), slots)
    return QueryVectors(vectors), list(item_ids)


@dataclass(frozen=True)
class QuerySide:
    """A labelled query sample's vectors in one space: read from a file, or embedded by a
    model from the sample's images."""

    vectors: Path | None = None
    model: Path | None = None


def cutover(
    params: Params,
    store: Path,
    reason: str,
    query_split: Path,
    new: QuerySide,
    old: QuerySide,
    device: str = "cpu",
) -> ServingStep:
    """Make the completed backfill's new space final once its shadow evaluation passes; the
    sample's items are held out of the gallery it is scored against."""
    from modelupgrade.data.image_table import read_labelled_images
    from modelupgrade.store.cutover import cutover as cut_over
    from modelupgrade.store.shadow import QuerySample, shadow_evaluate

    images = new.model is not None or old.model is not None
    frame = read_labelled_images(query_split, "the query sample", images)
    new_vectors = _query_vectors(params, frame, new, "new", device)
    old_vectors = _query_vectors(params, frame, old, "old", device)
    ids = tuple(frame["item_id"].astype(str))
    sample = QuerySample(
        frame["label"].to_numpy(np.int64), new_vectors, old_vectors, str(query_split), ids
    )
    with GalleryStore.open(store) as gallery:
        return cut_over(
            gallery,
            reason,
            params.store.rollback_window_hours,
            lambda backfill: shadow_evaluate(gallery, backfill, sample, params),
        )


def _query_vectors(
    params: Params, frame: Any, side: QuerySide, name: str, device: str
) -> np.ndarray | None:
    """The query sample in the ``name`` space: read from a file, embedded by a model, or None
    (read from the store for the sample's stored items)."""
    from modelupgrade.data import load_images
    from modelupgrade.data.vector_table import vectors_for_items
    from modelupgrade.store.models import model_embed_fn

    if side.vectors is not None and side.model is not None:
        raise UserError(
            f"give the query sample's {name}-space vectors one way: --{name}-query-vectors "
            f"or --{name}-model",
            hint=f"--{name}-query-vectors (a parquet of item_id and embedding, or a .npy), "
            f"--{name}-model DIR to embed its images, or neither for stored items",
        )
    if side.vectors is not None:
        ids = frame["item_id"].astype(str).tolist()
        return vectors_for_items(side.vectors, ids, f"{name}-space query vectors")
    if side.model is None:
        return None
    images = load_images(frame, params.dataset)
    return model_embed_fn(side.model, params.store.embed_batch_size, device)(images.numpy())


def rollback(store: Path, reason: str) -> ServingStep:
    """Serve the old space again after a backfill, while its vectors are kept."""
    from modelupgrade.store.cutover import rollback as roll_back

    with GalleryStore.open(store) as gallery:
        return roll_back(gallery, reason)


def cleanup(store: Path, reason: str, force: bool = False) -> ServingStep:
    """Drop the old space's vectors of a cut-over backfill once its rollback window passed."""
    from modelupgrade.store.cutover import cleanup as clean_up

    with GalleryStore.open(store) as gallery:
        return clean_up(gallery, reason, force)
