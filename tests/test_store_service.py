"""The HTTP service over the store, through fastapi.testclient; each test on each backend (the
``backend`` fixture: embedded, Milvus Lite). The service runs in the test's process, so it is the
one process that opens a Milvus Lite file."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from modelupgrade.config.store import StoreParams
from modelupgrade.ordering import build_ordering
from modelupgrade.serving import build_serving_mode
from modelupgrade.store import (
    BackendSettings,
    BackfillJob,
    HeadTransforms,
    SpaceSpec,
    TransformStored,
)
from modelupgrade.store.service import create_app, public_text
from tests.store_helpers import (
    NEW,
    PROJECT_PARAMS,
    build_gallery,
    milvus_lite_held,
    psi,
    reverse,
)


def _half_backfilled(path: Path, backend: BackendSettings) -> None:
    with build_gallery(path, 400, backend=backend) as store:
        BackfillJob(
            store, NEW, TransformStored(psi), build_ordering("random"), 50, progress=False
        ).run(max_chunks=4)


def _half_backfilled_rqt_app(path: Path, backend: BackendSettings, **settings: Any) -> FastAPI:
    """The service of a half-backfilled store at ``path`` in rank-merge-rqt mode (``settings``:
    more of ``create_app``'s)."""
    _half_backfilled(path, backend)
    return create_app(
        path,
        build_serving_mode("rank-merge-rqt"),
        heads=HeadTransforms(reverse=reverse),
        **settings,
    )


def test_search_health_and_status_during_a_backfill(
    tmp_path: Path, backend: BackendSettings
) -> None:
    app = _half_backfilled_rqt_app(tmp_path / "store", backend, top_k=7)
    with TestClient(app) as client:
        health = client.get("/health").json()
        assert health == {
            "status": "ok",
            "items": 400,
            "serving_space": "gen1",
            "mode": "rank-merge-rqt",
        }

        status = client.get("/backfill/status").json()
        assert status["vectors"]["backend"] == backend.kind
        assert status["backfill"]["done"] == 200 and status["backfill"]["pending"] == 200
        assert status["backfill"]["status"] == "running"

        queries = np.random.default_rng(0).normal(size=(2, NEW.dim)).tolist()
        body = client.post("/search", json={"vectors": queries}).json()
        assert body["serving_space"] == "gen1" and body["k"] == 7
        assert [len(row) for row in body["results"]] == [7, 7]
        for row in body["results"]:
            assert len({hit["item_id"] for hit in row}) == 7
            assert {hit["space"] for hit in row} <= {"gen0", "gen1"}
            distances = [hit["distance"] for hit in row]
            assert distances == sorted(distances)


def test_bad_queries_get_a_400_with_a_hint(tmp_path: Path, backend: BackendSettings) -> None:
    _half_backfilled(tmp_path / "store", backend)
    app = create_app(
        tmp_path / "store", build_serving_mode("mixed"), heads=HeadTransforms(forward=psi)
    )
    with TestClient(app) as client:
        response = client.post("/search", json={"vectors": [[0.0] * (NEW.dim + 1)], "k": 3})
        assert response.status_code == 400
        assert "12-d" in response.json()["detail"]["error"]
        assert response.json()["detail"]["hint"]
        assert client.post("/search", json={"vectors": [[1.0, 2.0], [1.0]]}).status_code == 400
        assert client.post("/search", json={"vectors": [], "k": 3}).status_code == 422


def test_a_token_guards_search_and_status_but_not_health(
    tmp_path: Path, backend: BackendSettings
) -> None:
    app = _half_backfilled_rqt_app(tmp_path / "store", backend, token="s3cret")
    query = {"vectors": np.ones((1, NEW.dim)).tolist(), "k": 2}
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            assert client.post("/search", json=query, headers=headers).status_code == 401
            assert client.get("/backfill/status", headers=headers).status_code == 401
        good = {"Authorization": "Bearer s3cret"}
        assert client.post("/search", json=query, headers=good).status_code == 200
        assert client.get("/backfill/status", headers=good).status_code == 200


def test_serve_warns_when_reachable_from_other_machines_without_a_token(
    tmp_path: Path,
    backend: BackendSettings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import uvicorn

    from modelupgrade.commands.store import serve
    from modelupgrade.params import load_params
    from modelupgrade.store.service import TOKEN_ENV, exposure_warning

    assert exposure_warning("0.0.0.0", None) and exposure_warning("192.168.1.4", "")
    assert exposure_warning("127.0.0.1", None) is None and exposure_warning("::1", None) is None
    assert exposure_warning("localhost", None) is None
    assert exposure_warning("0.0.0.0", "s3cret") is None
    build_gallery(tmp_path / "store", 10, backend=backend).close()
    bound: list[str] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, host, port, **limits: bound.append(host))
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    params = load_params(PROJECT_PARAMS)
    with caplog.at_level(logging.WARNING, logger="modelupgrade.commands.store"):
        serve(params, tmp_path / "store", host="0.0.0.0")
        monkeypatch.setenv(TOKEN_ENV, "s3cret")
        serve(params, tmp_path / "store", host="0.0.0.0")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert bound == ["0.0.0.0", "0.0.0.0"]
    assert len(warnings) == 1 and TOKEN_ENV in warnings[0]


def test_requests_beyond_the_limits_get_a_400_naming_them(
    tmp_path: Path, backend: BackendSettings
) -> None:
    app = _half_backfilled_rqt_app(tmp_path / "store", backend, max_query_vectors=3, max_k=20)
    with TestClient(app) as client:
        four = client.post("/search", json={"vectors": np.ones((4, NEW.dim)).tolist()})
        assert four.status_code == 400
        assert "store.max_query_vectors" in four.json()["detail"]["hint"]
        wide = client.post("/search", json={"vectors": np.ones((3, NEW.dim)).tolist(), "k": 21})
        assert wide.status_code == 400 and "store.max_k" in wide.json()["detail"]["hint"]
        body = client.post("/search", json={"vectors": np.ones((3, NEW.dim)).tolist(), "k": 20})
        assert body.status_code == 200 and [len(r) for r in body.json()["results"]] == [20] * 3
    defaults = StoreParams()
    assert (defaults.max_query_vectors, defaults.max_k) == (64, 1000)


def test_health_is_503_when_search_does_not_work(tmp_path: Path, backend: BackendSettings) -> None:
    _half_backfilled(tmp_path / "store", backend)
    # gen1 is not backward compatible and no forward head is given: mixed cannot search.
    app = create_app(tmp_path / "store", build_serving_mode("mixed"))
    with TestClient(app) as client:
        health = client.get("/health")
        assert health.status_code == 503
        assert health.json()["status"] == "unavailable"
        assert "not backward compatible" in health.json()["error"]
        query = {"vectors": np.ones((1, NEW.dim)).tolist()}
        assert client.post("/search", json=query).status_code == 400


def test_a_service_whose_milvus_is_out_of_reach_answers_503_until_it_is_back(
    tmp_path: Path,
) -> None:
    """The service's vectors out of reach (here: its Milvus Lite file held by another process)
    is the server's fault, not the request's: /health and /search answer 503, then 200 again once
    the vectors are back."""
    pytest.importorskip("milvus_lite")
    app = _half_backfilled_rqt_app(tmp_path / "store", BackendSettings(kind="milvus"))
    query = {"vectors": np.ones((1, NEW.dim)).tolist(), "k": 3}
    with TestClient(app) as client:
        with milvus_lite_held(tmp_path / "store"):
            health = client.get("/health")
            search = client.post("/search", json=query)
            assert client.get("/backfill/status").status_code == 200  # the ledger needs no Milvus
        assert health.status_code == 503, health.text
        assert "another process holds the lock" in health.json()["error"]
        assert search.status_code == 503, search.text
        assert "one process at a time" in search.json()["detail"]["hint"]
        assert str(tmp_path) not in health.text + search.text
        assert client.get("/health").json()["status"] == "ok"
        assert client.post("/search", json=query).status_code == 200


def test_no_response_names_a_path_of_the_server(tmp_path: Path, backend: BackendSettings) -> None:
    store = tmp_path / "deep" / "store"
    with build_gallery(store, 40, backend=backend) as gallery:
        spec = SpaceSpec("gen1", NEW.dim, ("gen0",), model_ref=str(tmp_path / "models" / "gen1"))
        BackfillJob(
            gallery, spec, TransformStored(psi), build_ordering("random"), 10, progress=False
        ).run(max_chunks=1)
    app = create_app(store, build_serving_mode("mixed"))
    with TestClient(app) as client:
        answers = [
            client.get("/backfill/status"),
            client.get("/health"),
            client.post("/search", json={"vectors": np.ones((1, NEW.dim)).tolist()}),
            client.post("/search", json={"vectors": np.ones((1, NEW.dim + 1)).tolist()}),
        ]
        status = answers[0].json()
    assert status["path"] == "store" and status["spaces"]["gen1"]["model_ref"] == "gen1"
    for answer in answers:
        assert str(tmp_path) not in answer.text and "/deep/" not in answer.text, answer.text
    assert public_text("cannot read /data/x/y.png: truncated") == "cannot read y.png: truncated"
