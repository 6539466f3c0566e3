"""A small HTTP service over a gallery store: ``/search``, ``/health``, ``/backfill/status``.

It answers at any moment of a backfill (run by a separate ``modelupgrade backfill`` process) from
consistent snapshots, and follows the store as it changes: a space dropped and created again (an
abort, then a new backfill) is read from its new files or collection, never from the ones that no
longer back the store. ``modelupgrade serve`` binds it to 127.0.0.1 unless told otherwise.

- Authentication: with a token (``modelupgrade serve`` reads it from the environment variable
  ``MODELUPGRADE_SERVICE_TOKEN``), every route but ``/health`` answers only requests that carry
  ``Authorization: Bearer <token>``, checked before any of the body is read.
- Limits, enforced before a body is parsed: at most ``max_request_bytes`` per body (413, by its
  Content-Length or while it arrives), received within ``request_timeout_s`` (408: a client that
  trickles its body is not kept); ``max_connections`` at once (503 beyond). A request may carry at
  most ``max_query_vectors`` query vectors and ask for at most ``max_k`` hits per query (400). A
  query vector must be finite, of non-zero norm, every value within ``max_query_magnitude``, and
  ``k`` an integer; booleans and strings are no numbers.
- Nothing is echoed: a malformed request's 422 names the field and the problem, not what was sent.
  No response names a path of the machine (cut to its last component) or carries a credential (a
  Milvus URI's ``user:password@`` is masked).
- ``/health`` fails (503) when the store failed the check the service ran when it opened it
  (``modelupgrade.store.verify.quick_check``), when the store directory it opened was removed or
  replaced, and when a probe search (one query, k = 1, the path ``/search`` takes) fails.
- No interactive docs (they load scripts from a CDN); the OpenAPI schema only with
  ``store.service_openapi``, behind the token.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, StrictFloat, StrictInt

from modelupgrade.config.store import StoreParams
from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject
from modelupgrade.retrieval.distance import Distance
from modelupgrade.serving.base import ServingMode
from modelupgrade.store.backends.base import VectorsUnavailable, without_credentials
from modelupgrade.store.faults import DiskFull, StoreDamaged
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.search import HeadTransforms, QueryVectors, Searcher

if TYPE_CHECKING:
    from modelupgrade.store.verify import VerifyReport

log = logging.getLogger(__name__)

TOKEN_ENV = "MODELUPGRADE_SERVICE_TOKEN"
_DEFAULTS = StoreParams()
# What a client may see of the store's own failures: the store is not the request's fault.
_UNAVAILABLE = (VectorsUnavailable, StoreDamaged, DiskFull)

# An absolute POSIX path inside a message: from a "/" that starts a word up to a delimiter.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/-])/(?:[^\s'\"/:,;()\[\]{}]+/)*([^\s'\"/:,;()\[\]{}]*)")


def public_text(text: str) -> str:
    """``text`` with every URI's credentials masked and every absolute path cut to its last
    component (what a client may see)."""
    return _ABSOLUTE_PATH.sub(lambda match: match.group(1) or "<path>", without_credentials(text))


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


Number = Annotated[StrictFloat | StrictInt, Field()]


class SearchRequest(BaseModel):
    vectors: list[list[Number]] = Field(
        min_length=1, description="query vectors in the serving space"
    )
    old_vectors: list[list[Number]] | None = Field(
        default=None,
        description="the same queries embedded by the old model (serving mode rank-merge)",
    )
    k: StrictInt | None = Field(default=None, ge=1)


class Hit(BaseModel):
    item_id: str
    distance: float
    space: str


class SearchResponse(BaseModel):
    serving_space: str
    mode: str
    k: int
    results: list[list[Hit]]


class _Refused(Exception):
    """A request the limits refuse while its body arrives."""

    def __init__(self, status: int, error: str, hint: str) -> None:
        super().__init__(error)
        self.status, self.error, self.hint = status, error, hint


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class RequestLimits:
    """ASGI middleware: the token, the body size and the body's time, before the app reads it."""

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        token: str | None,
        max_bytes: int,
        timeout_s: float,
        open_paths: frozenset[str] = frozenset({"/health"}),
    ) -> None:
        self.app, self.token, self.max_bytes, self.timeout_s = app, token, max_bytes, timeout_s
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1").lower(): value for key, value in scope["headers"]}
        refusal = self._refusal(scope["path"], headers)
        if refusal is None:
            try:
                body = await self._body(receive)
            except _Refused as refused:
                refusal = refusal or refused
        if refusal is not None:
            await _answer(send, refusal)
            return
        sent = False

        async def replay() -> Message:
            """The body read already, then whatever the connection says next (a disconnect)."""
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _body(self, receive: Receive) -> bytes:
        """The whole request body, read within the time and size limits before the app sees any of
        it (a body of at most ``max_bytes`` is held in memory once)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except TimeoutError:
                raise _Refused(
                    408,
                    f"the request body did not arrive within {self.timeout_s:g} s",
                    "send the whole body at once; the limit is params.yaml store.request_timeout_s",
                ) from None
            if message["type"] == "http.disconnect":
                raise _Refused(400, "the client went away before its body arrived", "retry")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _Refused(413, *self._too_large())
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    def _refusal(self, path: str, headers: dict[str, bytes]) -> _Refused | None:
        if self.token and path not in self.open_paths:
            scheme, _, given = headers.get("authorization", b"").decode("latin-1").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), self.token.encode()
            ):
                return _Refused(
                    401,
                    "missing or wrong bearer token",
                    "send the token as the header 'Authorization: Bearer <token>'",
                )
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                return _Refused(400, "the Content-Length header is not a number", "send one")
            if int(length) > self.max_bytes:
                return _Refused(413, *self._too_large())
        return None

    def _too_large(self) -> tuple[str, str]:
        return (
            f"the request body is larger than this service allows ({self.max_bytes:,} bytes)",
            "split the request; the limit is params.yaml store.max_request_bytes",
        )


async def _answer(send: Send, refused: _Refused) -> None:
    body = json.dumps({"detail": {"error": refused.error, "hint": refused.hint}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if refused.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def create_app(
    store_path: str | Path,
    mode: ServingMode,
    distance: Distance = "cosine",
    top_k: int = 10,
    heads: HeadTransforms | None = None,
    token: str | None = None,
    max_query_vectors: int = _DEFAULTS.max_query_vectors,
    max_k: int = _DEFAULTS.max_k,
    settings: StoreParams | None = None,
) -> Any:
    """The service over the store at ``store_path`` (``settings``: the limits of params.yaml's
    ``store`` section; its defaults otherwise), wrapped in its request limits."""
    from modelupgrade.store.verify import quick_check

    limits = settings or _DEFAULTS
    store = GalleryStore.open(store_path)
    searcher = Searcher(store, mode, distance, heads)
    opened = quick_check(store)
    if opened.inconsistencies:
        log.error("the store failed its check on open: %s", opened.exit_message)
    # Connected again at the first search: a Milvus Lite file is not held by an idle service.
    store.vectors.close()
    served = ServedStore(store, searcher, opened, mode, top_k, max_query_vectors, max_k, limits)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()

    app = FastAPI(
        title="modelupgrade gallery store",
        version="1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.store = store
    app.state.opened = opened
    app.add_exception_handler(RequestValidationError, _malformed)
    app.add_exception_handler(Exception, _failed)
    app.add_api_route("/health", served.health, methods=["GET"])
    app.add_api_route("/backfill/status", served.backfill_status, methods=["GET"])
    if limits.service_openapi:

        @app.get("/openapi.json", include_in_schema=False)
        def schema() -> dict[str, Any]:
            return app.openapi()

    app.add_api_route("/search", served.search, methods=["POST"], response_model=SearchResponse)
    return RequestLimits(app, token, limits.max_request_bytes, limits.request_timeout_s)


async def _malformed(_: Request, err: Exception) -> JSONResponse:
    """A request that does not validate: 422 naming each field and its problem, not its value."""
    assert isinstance(err, RequestValidationError)
    problems = [
        {
            "where": ".".join(str(part) for part in problem.get("loc", ())),
            "problem": str(problem.get("msg", "invalid"))[:200],
        }
        for problem in err.errors()[:10]
    ]
    return JSONResponse({"detail": problems}, status_code=422)


async def _failed(_: Request, err: Exception) -> JSONResponse:
    """Any other failure: 500, logged here, nothing of it told to the client."""
    log.exception("the service failed on a request")
    return JSONResponse(
        {"detail": {"error": "internal error", "hint": "the service's log says more"}},
        status_code=500,
    )


@dataclass(frozen=True)
class ServedStore:
    """The store one service answers from, and its routes: ``/health``, ``/backfill/status`` and
    ``/search``."""

    store: GalleryStore
    searcher: Searcher
    opened: VerifyReport
    mode: ServingMode
    top_k: int
    max_query_vectors: int
    max_k: int
    limits: StoreParams

    def unavailable(self) -> str | None:
        """Why the service must not answer from its store now (None: it may)."""
        if self.opened.inconsistencies:
            return (
                f"the store failed its check when the service opened it: {self.opened.exit_message}"
            )
        if not self.store.db.still_backs_the_store():
            return "the store the service opened was removed or replaced; restart the service"
        return None

    def probe(self) -> None:
        """One query of ones, k = 1, through the search path (and the old model's form of it,
        for the modes that need one)."""
        snapshot = self.searcher.snapshot()
        if snapshot.serving_space is None:
            raise UserError("the store is empty", hint="ingest a gallery first")
        spaces = self.store.spaces()
        serving = spaces[snapshot.serving_space]
        old = [spaces[name] for name in set(snapshot.spaces) if name != serving.name]
        old_dim = (old[0] if old else serving).dim
        self.searcher.search(
            QueryVectors(np.ones((1, serving.dim), np.float32), np.ones((1, old_dim), np.float32)),
            1,
        )

    def health(self) -> JSONResponse:
        problem = self.unavailable()
        try:
            if problem is None:
                self.probe()
        except Exception as err:  # noqa: BLE001 - any failure of the search path: search is down
            problem = err.message if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
        if problem is not None:
            log.warning("health probe failed: %s", problem)
            body: JsonObject = {
                "status": "unavailable",
                "mode": self.mode.registry_name,
                "error": public_text(problem.splitlines()[0]),
            }
            return JSONResponse(body, status_code=503)
        snapshot = self.searcher.snapshot()
        return JSONResponse(
            {
                "status": "ok",
                "items": len(snapshot),
                "serving_space": snapshot.serving_space,
                "mode": self.mode.registry_name,
            }
        )

    # The annotation is FastAPI's response model of the route (its OpenAPI schema): kept as it was.
    def backfill_status(self) -> dict[str, Any]:
        status = self.store.status()
        shown = status.as_dict()
        shown["path"] = Path(status.path).name
        return public(shown)

    def search(self, request: SearchRequest) -> SearchResponse:
        k = request.k or self.top_k
        problem = self.unavailable()
        if problem is not None:
            raise HTTPException(503, {"error": public_text(problem.splitlines()[0]), "hint": None})
        try:
            hits = self.searcher.search(self.queries(request, k), k)
        except _UNAVAILABLE as err:
            # The store is out of reach or damaged, not the request wrong: the client may retry.
            raise HTTPException(
                status_code=503,
                detail={"error": public_text(err.message), "hint": public(err.hint)},
            ) from None
        except UserError as err:
            raise HTTPException(
                status_code=400,
                detail={"error": public_text(err.message), "hint": public(err.hint)},
            ) from None
        return SearchResponse(
            serving_space=str(self.searcher.snapshot().serving_space),
            mode=self.mode.registry_name,
            k=k,
            results=[[Hit(**hit) for hit in row] for row in hits.records()],
        )

    def queries(self, request: SearchRequest, k: int) -> QueryVectors:
        """The request's query vectors, within the service's limits (``UserError`` otherwise)."""
        _within(
            "query vectors per request",
            len(request.vectors),
            self.max_query_vectors,
            "store.max_query_vectors",
        )
        _within("k", k, self.max_k, "store.max_k")
        magnitude = self.limits.max_query_magnitude
        return QueryVectors(
            _matrix(request.vectors, "query vectors", magnitude),
            None
            if request.old_vectors is None
            else _matrix(request.old_vectors, "old query vectors", magnitude),
        )


def run_service(
    store: Path,
    settings: StoreParams,
    host: str | None,
    port: int | None,
    mode: str | None,
    heads: HeadTransforms,
) -> None:
    """``modelupgrade serve``: the service of ``store`` on ``host``:``port`` (defaults from
    ``settings``), with its limits."""
    import os

    import uvicorn

    from modelupgrade.serving import build_serving_mode

    token = os.environ.get(TOKEN_ENV) or None
    bind = host or settings.host
    app = create_app(
        store,
        build_serving_mode(mode or settings.serving_mode),
        settings.distance,
        settings.top_k,
        heads,
        token=token,
        max_query_vectors=settings.max_query_vectors,
        max_k=settings.max_k,
        settings=settings,
    )
    warning = exposure_warning(bind, token)
    if warning:
        log.warning(warning)
    uvicorn.run(
        app,
        host=bind,
        port=port or settings.port,
        limit_concurrency=settings.max_connections,
        timeout_keep_alive=5,
        server_header=False,
    )


def _within(what: str, value: int, limit: int, key: str) -> None:
    if value > limit:
        raise UserError(
            f"{what} is {value}, more than this service allows ({limit})",
            hint=f"split the request; the limit is params.yaml {key}",
        )


def _matrix(rows: list[list[float | int]], what: str, magnitude: float) -> np.ndarray:
    """``rows`` as query vectors: of one length, finite, within ``magnitude`` (zero vectors are
    the search's to refuse: ``Searcher``)."""
    lengths = {len(vector) for vector in rows}
    if len(lengths) != 1:
        raise UserError(f"all {what} must have the same length, got lengths {sorted(lengths)}")
    bad = [i for i, row in enumerate(rows) if not all(math.isfinite(x) for x in row)]
    if bad:
        raise UserError(
            f"{what} must be finite numbers; row {bad[0]} holds NaN or infinity",
            hint="send the vectors the model gives",
        )
    matrix = np.asarray(rows, dtype=np.float64)
    if (np.abs(matrix) > magnitude).any():
        row = int(np.flatnonzero((np.abs(matrix) > magnitude).any(axis=1))[0])
        raise UserError(
            f"{what}: row {row} holds a value beyond ±{magnitude:g}, no embedding's",
            hint="send the vectors the model gives; the limit is params.yaml "
            "store.max_query_magnitude",
        )
    return matrix.astype(np.float32)
