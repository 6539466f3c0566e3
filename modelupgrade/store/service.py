"""A small HTTP service over a gallery store: ``/search``, ``/health``, ``/backfill/status``.

It answers at any moment of a backfill (run by a separate ``modelupgrade backfill`` process) from
consistent snapshots. ``modelupgrade serve`` binds it to 127.0.0.1 unless told otherwise.

- Authentication: with a token (``modelupgrade serve`` reads it from the environment variable
  ``MODELUPGRADE_SERVICE_TOKEN``), ``/search`` and ``/backfill/status`` answer only requests that
  carry ``Authorization: Bearer <token>``; ``/health`` stays open for probes.
- Limits: a request may carry at most ``max_query_vectors`` query vectors and ask for at most
  ``max_k`` hits per query (params.yaml ``store.max_query_vectors`` and ``store.max_k``); beyond
  them it gets a 400 naming the limit.
- ``/health`` runs one probe search (one query, k = 1) through the same path as ``/search`` and
  answers 503 when it fails, so a store that cannot serve is not reported ok.
- No response names a path of the machine: store, model and image paths are cut to their last
  component.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from modelupgrade.config.store import StoreParams
from modelupgrade.errors import UserError
from modelupgrade.retrieval.distance import Distance
from modelupgrade.serving.base import ServingMode
from modelupgrade.store.backends.base import VectorsUnavailable
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.search import HeadTransforms, QueryVectors, Searcher

log = logging.getLogger(__name__)

TOKEN_ENV = "MODELUPGRADE_SERVICE_TOKEN"
_DEFAULTS = StoreParams()

# An absolute POSIX path inside a message: from a "/" that starts a word up to a delimiter.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~-])/(?:[^\s'\"/:,;()\[\]{}]+/)*([^\s'\"/:,;()\[\]{}]*)")


def public_text(text: str) -> str:
    """``text`` with every absolute path cut to its last component (what a client may see)."""
    return _ABSOLUTE_PATH.sub(lambda match: match.group(1) or "<path>", text)


def public(value: Any) -> Any:
    """``public_text`` applied to every string inside ``value`` (dicts, lists)."""
    if isinstance(value, str):
        return public_text(value)
    if isinstance(value, dict):
        return {key: public(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [public(item) for item in value]
    return value


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` keeps the service on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, token: str | None) -> str | None:
    """The warning to give when the service is reachable from other machines without a token."""
    if token or is_loopback(host):
        return None
    return (
        f"serving on {host} without authentication: anyone who can reach this address can "
        f"search the gallery and read its status; set {TOKEN_ENV} to require a bearer token"
    )


class SearchRequest(BaseModel):
    vectors: list[list[float]] = Field(
        min_length=1, description="query vectors in the serving space"
    )
    old_vectors: list[list[float]] | None = Field(
        default=None,
        description="the same queries embedded by the old model (serving mode rank-merge)",
    )
    k: int | None = Field(default=None, ge=1)


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
    token: str | None = None,
    max_query_vectors: int = _DEFAULTS.max_query_vectors,
    max_k: int = _DEFAULTS.max_k,
) -> FastAPI:
    store = GalleryStore.open(store_path)
    searcher = Searcher(store, mode, distance, heads)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()

    app = FastAPI(title="modelupgrade gallery store", version="1", lifespan=lifespan)
    app.state.store = store

    def authorized(request: Request) -> None:
        if not token:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), token.encode()
        ):
            raise HTTPException(
                status_code=401,
                detail={
                    "error": "missing or wrong bearer token",
                    "hint": "send the token as the header 'Authorization: Bearer <token>'",
                },
                headers={"WWW-Authenticate": "Bearer"},
            )

    def _bad_request(err: UserError) -> HTTPException:
        return HTTPException(
            status_code=400,
            detail={"error": public_text(err.message), "hint": public(err.hint)},
        )

    def probe() -> None:
        """One query of ones, k = 1, through the search path (and the old model's form of it,
        for the modes that need one)."""
        snapshot = searcher.snapshot()
        if snapshot.serving_space is None:
            raise UserError("the store is empty", hint="ingest a gallery first")
        spaces = store.spaces()
        serving = spaces[snapshot.serving_space]
        old = [spaces[name] for name in set(snapshot.spaces) if name != serving.name]
        old_dim = (old[0] if old else serving).dim
        searcher.search(
            QueryVectors(np.ones((1, serving.dim), np.float32), np.ones((1, old_dim), np.float32)),
            1,
        )

    @app.get("/health")
    def health() -> JSONResponse:
        try:
            probe()
        except Exception as err:  # noqa: BLE001 - any failure of the search path: search is down
            log.warning("health probe failed: %s", err)
            message = err.message if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
            body: dict[str, Any] = {
                "status": "unavailable",
                "mode": mode.registry_name,
                "error": public_text(message),
            }
            return JSONResponse(body, status_code=503)
        snapshot = searcher.snapshot()
        return JSONResponse(
            {
                "status": "ok",
                "items": len(snapshot),
                "serving_space": snapshot.serving_space,
                "mode": mode.registry_name,
            }
        )

    @app.get("/backfill/status", dependencies=[Depends(authorized)])
    def backfill_status() -> dict[str, Any]:
        status = store.status().as_dict()
        status["path"] = Path(status["path"]).name
        return public(status)

    @app.post("/search", response_model=SearchResponse, dependencies=[Depends(authorized)])
    def search(request: SearchRequest) -> SearchResponse:
        k = request.k or top_k
        try:
            _within(
                "query vectors per request",
                len(request.vectors),
                max_query_vectors,
                "store.max_query_vectors",
            )
            _within("k", k, max_k, "store.max_k")
            queries = QueryVectors(
                _matrix(request.vectors, "query vectors"),
                None
                if request.old_vectors is None
                else _matrix(request.old_vectors, "old query vectors"),
            )
            hits = searcher.search(queries, k)
        except VectorsUnavailable as err:
            # The server's vectors are out of reach, not the request wrong: the client may retry.
            raise HTTPException(
                status_code=503,
                detail={"error": public_text(err.message), "hint": public(err.hint)},
            ) from None
        except UserError as err:
            raise _bad_request(err) from None
        return SearchResponse(
            serving_space=str(searcher.snapshot().serving_space),
            mode=mode.registry_name,
            k=k,
            results=[[Hit(**hit) for hit in row] for row in hits.records()],
        )

    return app


def _within(what: str, value: int, limit: int, key: str) -> None:
    if value > limit:
        raise UserError(
            f"{what} is {value}, more than this service allows ({limit})",
            hint=f"split the request; the limit is params.yaml {key}",
        )


def _matrix(rows: list[list[float]], what: str) -> np.ndarray:
    lengths = {len(vector) for vector in rows}
    if len(lengths) != 1:
        raise UserError(f"all {what} must have the same length, got lengths {sorted(lengths)}")
    return np.asarray(rows, dtype=np.float32)
