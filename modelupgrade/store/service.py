"""A small HTTP service over a gallery store: ``/search``, ``/health``, ``/backfill/status``.

It answers at any moment of a backfill (run by a separate ``modelupgrade backfill`` process) from
consistent snapshots. ``modelupgrade serve`` binds it to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from modelupgrade.errors import UserError
from modelupgrade.retrieval.distance import Distance
from modelupgrade.serving.base import ServingMode
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.search import HeadTransforms, QueryVectors, Searcher


class SearchRequest(BaseModel):
    vectors: list[list[float]] = Field(
        min_length=1, description="query vectors in the serving space"
    )
    old_vectors: list[list[float]] | None = Field(
        default=None,
        description="the same queries embedded by the old model (serving mode rank-merge)",
    )
    k: int | None = Field(default=None, ge=1, le=10_000)


class Hit(BaseModel):
    item_id: str
    distance: float
    space: str


class SearchResponse(BaseModel):
    serving_space: str
    mode: str
    k: int
    results: list[list[Hit]]


def create_app(
    store_path: str | Path,
    mode: ServingMode,
    distance: Distance = "cosine",
    top_k: int = 10,
    heads: HeadTransforms | None = None,
) -> FastAPI:
    store = GalleryStore.open(store_path)
    searcher = Searcher(store, mode, distance, heads)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()

    app = FastAPI(title="modelupgrade gallery store", version="1", lifespan=lifespan)
    app.state.store = store

    def _bad_request(err: UserError) -> HTTPException:
        return HTTPException(status_code=400, detail={"error": err.message, "hint": err.hint})

    @app.get("/health")
    def health() -> dict[str, Any]:
        snapshot = searcher.snapshot()
        return {
            "status": "ok",
            "items": len(snapshot),
            "serving_space": snapshot.serving_space,
            "mode": mode.registry_name,
        }

    @app.get("/backfill/status")
    def backfill_status() -> dict[str, Any]:
        return store.status().as_dict()

    @app.post("/search", response_model=SearchResponse)
    def search(request: SearchRequest) -> SearchResponse:
        k = request.k or top_k
        try:
            queries = QueryVectors(
                _matrix(request.vectors, "query vectors"),
                None
                if request.old_vectors is None
                else _matrix(request.old_vectors, "old query vectors"),
            )
            hits = searcher.search(queries, k)
        except UserError as err:
            raise _bad_request(err) from None
        return SearchResponse(
            serving_space=str(searcher.snapshot().serving_space),
            mode=mode.registry_name,
            k=k,
            results=[[Hit(**hit) for hit in row] for row in hits.records()],
        )

    return app


def _matrix(rows: list[list[float]], what: str) -> np.ndarray:
    lengths = {len(vector) for vector in rows}
    if len(lengths) != 1:
        raise UserError(f"all {what} must have the same length, got lengths {sorted(lengths)}")
    return np.asarray(rows, dtype=np.float32)
