"""The HTTP service against a hostile client (issue 30, item 5): no credential in any answer, no
schema or docs without the token (and no third-party script), a body refused before it is parsed
when it is too large or unauthenticated, nothing echoed back, a body that trickles cut off, and
query vectors checked (finite, of some direction, of sane size; ``k`` an integer)."""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from fastapi.testclient import TestClient

from modelupgrade.config.store import StoreParams
from modelupgrade.serving import build_serving_mode
from modelupgrade.store import BackendSettings, HeadTransforms
from modelupgrade.store.backends.milvus import is_server_uri
from modelupgrade.store.service import create_app
from tests.store_helpers import NEW, PROJECT_PARAMS, PROJECT_ROOT, build_gallery, psi_job, reverse

TOKEN = "s3cret-token"


def _store(path: Path, backend: BackendSettings | None = None) -> Path:
    with build_gallery(path, 200, backend=backend) as store:
        psi_job(store, chunk=50).run(max_chunks=2)
    return path


def _client(path: Path, token: str | None = None, **settings: object) -> TestClient:
    return TestClient(
        create_app(
            path,
            build_serving_mode("rank-merge-rqt"),
            heads=HeadTransforms(reverse=reverse),
            token=token,
            settings=StoreParams(**settings),  # type: ignore[arg-type]
        )
    )


def test_no_answer_carries_the_milvus_credentials(
    backend: BackendSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store whose recorded URI carries ``user:password@`` (as one written before they were
    refused there): masked in every answer, the status command's, and the errors'."""
    from modelupgrade.cli.arguments import run_command
    from modelupgrade.commands.store import store_status

    if not is_server_uri(backend.uri):
        pytest.skip("only a server URI carries credentials")
    path = _store(tmp_path / "s", backend)
    secret = "s3cretpw"
    with sqlite3.connect(path / "store.sqlite") as db:
        db.execute(
            "UPDATE meta SET value = ? WHERE key = 'vector_uri'",
            (backend.uri.replace("http://", f"http://root:{secret}@"),),
        )
    with _client(path) as client:
        answers = [client.get("/health"), client.get("/backfill/status")]
        answers.append(client.post("/search", json={"vectors": np.ones((1, NEW.dim)).tolist()}))
    for answer in answers:
        assert secret not in answer.text, answer.text
    assert answers[1].json()["vectors"]["uri"].startswith("http://127.0.0.1:")
    run_command(store_status, ["--params", str(PROJECT_PARAMS), "--store", str(path), "--json"])
    assert secret not in capsys.readouterr().out
    # Out of reach, the error names the server without its credentials.
    with sqlite3.connect(path / "store.sqlite") as db:
        db.execute(
            "UPDATE meta SET value = ? WHERE key = 'vector_uri'",
            (f"http://root:{secret}@127.0.0.1:9/",),
        )
    with _client(path) as client:
        down = client.post("/search", json={"vectors": np.ones((1, NEW.dim)).tolist()})
        health = client.get("/health")
    assert down.status_code == 503 and health.status_code == 503
    assert secret not in down.text + health.text


def test_no_schema_or_docs_without_the_token_and_no_third_party_script(tmp_path: Path) -> None:
    path = _store(tmp_path / "s")
    with _client(path, TOKEN) as client:
        for route in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
            assert client.get(route).status_code in (401, 404), route
    with _client(path, TOKEN, service_openapi=True) as client:
        assert client.get("/openapi.json").status_code == 401
        schema = client.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})
        assert schema.status_code == 200 and "/search" in schema.json()["paths"]
        assert client.get("/docs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 404
        assert "cdn" not in schema.text.lower()


def test_no_schema_or_docs_unless_a_setting_turns_the_schema_on(tmp_path: Path) -> None:
    """Off by default, the schema and the docs are served to no one: not to a client with the
    token, nor by a service without one (the token alone would hide them only from the others)."""
    path = _store(tmp_path / "s")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    routes = ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect")
    with _client(path, TOKEN) as client:
        assert [client.get(route, headers=auth).status_code for route in routes] == [404] * 4
    with _client(path) as client:
        assert [client.get(route).status_code for route in routes] == [404] * 4


def test_a_body_too_large_or_unauthenticated_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = _store(tmp_path / "s")
    big = b'{"vectors": [[' + b"0.5, " * 1_200_000 + b"0.5]]}"  # 6 MB
    reads: list[int] = []

    def trickle() -> Iterator[bytes]:  # a body without a Content-Length, as a stream sends it
        for start in range(0, len(big), 1 << 16):
            reads.append(start)
            yield big[start : start + (1 << 16)]

    with _client(path, TOKEN, max_request_bytes=1 << 20) as client:
        headers = {"Content-Type": "application/json"}
        refused = client.post("/search", content=big, headers=headers)
        assert refused.status_code == 401
        auth = {**headers, "Authorization": f"Bearer {TOKEN}"}
        large = client.post("/search", content=big, headers=auth)
        assert large.status_code == 413 and "store.max_request_bytes" in large.text
        streamed = client.post("/search", content=trickle(), headers=auth)
        assert streamed.status_code == 413
        query = {"vectors": np.ones((1, NEW.dim)).tolist()}
        assert client.post("/search", json=query, headers=auth).status_code == 200


def _posted(app: Any, headers: list[tuple[bytes, bytes]]) -> tuple[int, int]:
    """POST /search with ``headers`` straight to the ASGI ``app``, a body of ``{}`` waiting: the
    status answered, and how many times the app asked for the body."""
    reads: list[int] = []
    answers: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        reads.append(1)
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        answers.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "scheme": "http",
        "method": "POST",
        "path": "/search",
        "raw_path": b"/search",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    asyncio.run(app(scope, receive, send))
    return int(answers[0]["status"]), len(reads)  # type: ignore[call-overload]


def test_a_content_length_over_the_limit_is_refused_before_any_byte_is_read(
    tmp_path: Path,
) -> None:
    """The declared length alone refuses a body: the service answers 413 without reading one byte
    (a client that announces 1 GB is not made to send any of it)."""
    app = _client(_store(tmp_path / "s"), max_request_bytes=1024).app
    assert _posted(app, [(b"content-length", b"1025")]) == (413, 0)


def test_an_unauthenticated_body_is_refused_before_any_byte_is_read(tmp_path: Path) -> None:
    """Without the token the service answers 401 without reading one byte of the body, even one
    within the size limit (before: a 67 MB body was parsed in full before the 401)."""
    app = _client(_store(tmp_path / "s"), TOKEN).app
    assert _posted(app, [(b"content-length", b"2")]) == (401, 0)
    wrong = (b"authorization", b"Bearer not-" + TOKEN.encode())
    assert _posted(app, [(b"content-length", b"2"), wrong]) == (401, 0)


def test_a_malformed_request_is_not_echoed_back(tmp_path: Path) -> None:
    path = _store(tmp_path / "s")
    with _client(path) as client:
        answer = client.post("/search", json={"vectors": [[1.0] * NEW.dim], "k": "x" * 1_000_000})
    assert answer.status_code == 422
    assert len(answer.content) < 2000 and "xxxx" not in answer.text
    assert answer.json()["detail"][0]["where"] == "body.k"


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ('{"vectors": [[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]]}', 400, "zero vector"),
        ('{"vectors": [[1e30, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]}', 400, "beyond"),
        ('{"vectors": [[NaN, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]}', 400, "finite"),
        ('{"vectors": [[Infinity, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]}', 400, "finite"),
        ('{"vectors": [[true, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]}', 422, "body.vectors"),
        ('{"vectors": [["1", 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]}', 422, "body.vectors"),
        ('{"vectors": [[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]], "k": "5"}', 422, "body.k"),
        ('{"vectors": [[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]], "k": 5.5}', 422, "body.k"),
        ('{"vectors": [[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]], "k": true}', 422, "body.k"),
    ],
)
def test_query_vectors_and_k_are_checked(tmp_path: Path, body: str, status: int, says: str) -> None:
    path = _store(tmp_path / "s")
    with _client(path) as client:
        answer = client.post(
            "/search", content=body.encode(), headers={"Content-Type": "application/json"}
        )
    assert answer.status_code == status, answer.text
    assert says in answer.text


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_client_that_trickles_its_body_is_cut_off(tmp_path: Path) -> None:
    path = _store(tmp_path / "s")
    settings = yaml.safe_load(PROJECT_PARAMS.read_text())
    settings["store"] = {**settings["store"], "request_timeout_s": 2.0}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(settings))
    port = _free_port()
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "modelupgrade"),
            *("serve", "--params", str(params), "--store", str(path)),
            *("--mode", "rank-merge", "--port", str(port)),
        ],
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                client = socket.create_connection(("127.0.0.1", port), timeout=1)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        client.settimeout(15)
        client.sendall(
            b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        started, answer = time.monotonic(), b""
        while not answer:
            client.sendall(b" ")  # one byte every half second: never the whole body
            time.sleep(0.5)
            client.setblocking(False)
            try:
                answer = client.recv(4096)
            except BlockingIOError:
                pass
            except OSError:
                break
            client.setblocking(True)
            assert time.monotonic() - started < 15, "the trickling client was never cut off"
        assert b" 408 " in answer.split(b"\r\n")[0], answer[:200]
        assert time.monotonic() - started < 6
    finally:
        client.close()
        server.terminate()
        server.wait(timeout=30)
