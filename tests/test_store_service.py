"""The HTTP service over the store, through fastapi.testclient."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from modelupgrade.ordering import build_ordering
from modelupgrade.serving import build_serving_mode
from modelupgrade.store import BackfillJob, HeadTransforms, TransformStored
from modelupgrade.store.service import create_app
from tests.store_helpers import NEW, build_gallery, psi, reverse


def _half_backfilled(path: Path) -> None:
    with build_gallery(path, 400) as store:
        BackfillJob(
            store, NEW, TransformStored(psi), build_ordering("random"), 50, progress=False
        ).run(max_chunks=4)


def test_search_health_and_status_during_a_backfill(tmp_path: Path) -> None:
    _half_backfilled(tmp_path / "store")
    app = create_app(
        tmp_path / "store",
        build_serving_mode("rank-merge-rqt"),
        top_k=7,
        heads=HeadTransforms(reverse=reverse),
    )
    with TestClient(app) as client:
        health = client.get("/health").json()
        assert health == {
            "status": "ok",
            "items": 400,
            "serving_space": "gen1",
            "mode": "rank-merge-rqt",
        }

        status = client.get("/backfill/status").json()
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


def test_bad_queries_get_a_400_with_a_hint(tmp_path: Path) -> None:
    _half_backfilled(tmp_path / "store")
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
