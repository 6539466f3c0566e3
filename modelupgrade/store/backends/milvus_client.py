"""Opening a Milvus client for a store: its address (a server URI, or a Milvus Lite file), its
token, Milvus Lite's one engine per file and process, and every failed call as one error line that
names the Milvus (``modelupgrade.store.backends.milvus`` holds the vectors through it)."""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path
from typing import Any

from modelupgrade.errors import UserError
from modelupgrade.store.backends.base import VectorsUnavailable, without_credentials
from modelupgrade.store.schema import VECTORS_DIR

TOKEN_ENV = "MILVUS_TOKEN"
# A new store names its collections <prefix><12 hex digits>; the prefix groups a deployment's.
PREFIX_ENV = "MODELUPGRADE_MILVUS_PREFIX"
LITE_FILE = "milvus.db"
_SERVER_URI = re.compile(r"^(https?|tcp|grpc|unix)://|^unix:", re.IGNORECASE)
_CREDENTIALS_PART = re.compile(r"^([a-z][a-z0-9+.-]*://)[^/@\s]*@", re.IGNORECASE)
_LITE_INDEX_FILES = ("*/indexes/*.idx", "*/indexes/*.sidx")
log = logging.getLogger(__name__)


def without_userinfo(uri: str) -> str:
    """``uri`` without a ``user:password@`` part (a store written before credentials were refused
    in its URI keeps them there; they serve as its token)."""
    return _CREDENTIALS_PART.sub(r"\1", uri)


# Milvus Lite runs in this process, one engine per file, which holds the file's lock until it is
# released: the last store of the process to close a file releases it, so that another process (a
# resumed backfill, a server) can open it.
_LITE_USERS: dict[str, int] = {}
_LITE_LOCK = threading.Lock()


def release_lite(uri: str) -> None:
    """This process is done with the Milvus Lite file at ``uri``: the last user releases it."""
    with _LITE_LOCK:
        _LITE_USERS[uri] = _LITE_USERS.get(uri, 1) - 1
        if _LITE_USERS[uri] <= 0:
            del _LITE_USERS[uri]
            from milvus_lite.server_manager import server_manager_instance

            server_manager_instance.release_server(uri)


class _LiteFailure(logging.Filter):
    """Milvus Lite logs a failure (to open a file another process holds, say) as a traceback, and
    pymilvus then raises a bare "Open local milvus failed". While a call runs, this filter on
    Milvus Lite's logger keeps the cause for the one error line instead."""

    def __init__(self) -> None:
        super().__init__()
        self.cause: BaseException | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            self.cause = record.exc_info[1]
            return False
        return True


class _UnimplementedRpc(logging.Filter):
    """Milvus Lite serves pymilvus over gRPC in this process but implements not every call
    (AllocTimestamp, which pymilvus asks for after creating an index and does without); gRPC logs
    each such call as an error with a traceback, which would read as a failure of the command."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], NotImplementedError))


_UNIMPLEMENTED_RPC = _UnimplementedRpc()
# Where pymilvus and Milvus Lite log a failed call, each with a traceback.
_LOAD_ERROR_LOGGERS = ("pymilvus.decorators", "milvus_lite.adapter.grpc.servicer")


class _HeldErrors(logging.Filter):
    """Keeps every record off the logger's handlers while a call that may be retried runs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return False


def is_server_uri(uri: str) -> bool:
    return bool(_SERVER_URI.match(uri))


def milvus_address(store_path: Path, uri: str) -> str:
    """Where the store's vectors are: a server URI as given, else the Milvus Lite file's absolute
    path (by default inside the store)."""
    if not uri:
        return str((store_path / VECTORS_DIR / LITE_FILE).absolute())
    if is_server_uri(uri):
        return uri
    if not uri.endswith(".db"):
        raise UserError(
            f"store.uri {uri!r} is neither a Milvus server URI nor a Milvus Lite file",
            hint="give http://host:19530 for a server, a path ending in .db for Milvus Lite, "
            "or leave it empty for a Milvus Lite file inside the store",
        )
    return str(Path(uri).resolve())


class MilvusCalls:
    """The pymilvus client, each failure of a call turned into one error line naming the Milvus."""

    def __init__(self, client: Any, uri: str) -> None:
        from pymilvus.exceptions import MilvusException

        self._client, self._uri, self._error = client, without_credentials(uri), MilvusException

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except self._error as err:
                message = str(getattr(err, "message", err)).splitlines()[0]
                raise VectorsUnavailable(
                    f"Milvus at {self._uri} refused {name.replace('_', ' ')}: {message}",
                    hint="check that Milvus runs and holds the store's collections; the store's "
                    "ledger is untouched, so the command can be run again",
                ) from None

        return call


def open_client(uri: str, token: str, store_path: Path) -> Any:
    """A client of the Milvus at ``uri`` (a server, with ``token`` when given, or a Milvus Lite
    file, counted as used by this process), each failed call one error line; a Milvus that cannot
    be opened is a ``VectorsUnavailable`` naming it and the store."""
    try:
        from pymilvus import MilvusClient
    except ImportError:
        raise UserError(
            "the Milvus backend needs pymilvus (with milvus-lite for a local file)",
            hint="pip install pymilvus milvus-lite",
        ) from None
    lite_log = logging.getLogger("milvus_lite.server_manager")
    start_failure = _LiteFailure()
    try:
        if is_server_uri(uri):
            client = MilvusClient(uri=uri, token=token) if token else MilvusClient(uri)
            return MilvusCalls(client, uri)
        with _LITE_LOCK:
            logging.getLogger("grpc._server").addFilter(_UNIMPLEMENTED_RPC)  # again: a no-op
            # Under _LITE_LOCK: one connection opens at a time, so the filter sees only its own.
            lite_log.addFilter(start_failure)
            try:
                client = MilvusClient(uri=uri)
            finally:
                lite_log.removeFilter(start_failure)
            _LITE_USERS[uri] = _LITE_USERS.get(uri, 0) + 1
            return MilvusCalls(client, uri)
    except Exception as err:  # noqa: BLE001 - pymilvus raises several kinds; all mean the same
        server = is_server_uri(uri)
        cause = start_failure.cause or err
        reason = str(getattr(cause, "message", None) or cause or repr(cause)).splitlines()[0]
        raise VectorsUnavailable(
            f"cannot open the Milvus {'server' if server else 'Lite file'} "
            f"{without_credentials(uri)} of store {store_path}: "
            f"{without_credentials(reason)}",
            hint=f"check that the server runs and ${TOKEN_ENV} holds its token"
            if server
            else "Milvus Lite serves one process at a time: stop the other process using "
            "it, or run a Milvus server and point store.uri at it",
        ) from None


def load_collection(client: MilvusCalls, uri: str, name: str) -> None:
    """Load collection ``name`` for search. Milvus Lite writes a segment's index file in place (no
    temporary file and rename), so a process killed while it writes one leaves a short file that
    fails every later load ("No data left in file"). Index files are a cache of the segments'
    vectors: on a Milvus Lite file a failed load drops the collection's and loads again, and Lite
    builds them anew."""
    loggers = [logging.getLogger(logger) for logger in _LOAD_ERROR_LOGGERS]
    held = _HeldErrors()  # a load the retry mends is no error: its tracebacks stay off stderr
    for logger in loggers:
        logger.addFilter(held)
    try:
        client.load_collection(name)
        return
    except VectorsUnavailable as err:
        if is_server_uri(uri) or not _drop_lite_index_files(Path(uri), name):
            raise
        cause = err.message
    finally:
        for logger in loggers:
            logger.removeFilter(held)
    log.warning(
        "%s; its index files (a cache a killed process may have cut short) were dropped, and "
        "Milvus Lite rebuilds them from the vectors",
        cause,
    )
    client.load_collection(name)


def _drop_lite_index_files(lite_file: Path, name: str) -> int:
    """Remove the index files of collection ``name`` in the Milvus Lite file: how many it had."""
    partitions = lite_file / "collections" / name / "partitions"
    dropped = [path for pattern in _LITE_INDEX_FILES for path in partitions.glob(pattern)]
    for path in dropped:
        path.unlink()
    return len(dropped)
