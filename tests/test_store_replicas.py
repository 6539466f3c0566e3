"""Serving a server-backed store from anywhere (issue 29, item 4): the store publishes its serving
state beside its collections on every commit (``snapshots.serving_state``), so a client that knows
only the Milvus server, the store's collection prefix and that state searches a half-backfilled
gallery as the store's own search does, without the store's database. (Several ``modelupgrade
serve`` processes answering alike during a backfill: ``test_store_soak``.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pymilvus import MilvusClient

from modelupgrade.ordering import build_ordering
from modelupgrade.serving import build_serving_mode
from modelupgrade.store import (
    BackendSettings,
    BackfillJob,
    GalleryStore,
    Searcher,
    TransformStored,
)
from modelupgrade.store.backends.milvus import is_server_uri
from tests.store_helpers import COMPATIBLE_NEW as NEW
from tests.store_helpers import COMPATIBLE_OLD as OLD


def _outside_search(uri: str, token: str, prefix: str, query: np.ndarray, k: int) -> list[str]:
    """What a client of the Milvus server alone does (docs/store.md's recipe for a backward
    compatible new model, served mixed): read the state, search each space's collection with its
    filter, waiting for the write the state names, and merge by distance (COSINE: larger is
    nearer)."""
    client = MilvusClient(uri=uri, token=token)
    try:
        row = client.query(
            f"{prefix}__state",
            filter="key == 0",
            output_fields=["state"],
            consistency_level="Strong",  # the state as last committed, not as of seconds ago
        )[0]
        state = json.loads(row["state"])
        hits = []
        for space in state["spaces"].values():
            found = client.search(
                space["collection"],
                data=[query.tolist()],
                anns_field="vector",
                limit=k,
                filter=space["filter"],
                output_fields=["item_id"],
                search_params={"metric_type": state["metric"]},
                consistency_level="Customized",
                guarantee_timestamp=state["guarantee_timestamp"],
            )[0]
            hits += [(hit["distance"], hit["entity"]["item_id"]) for hit in found]
    finally:
        client.close()
    return [item for _, item in sorted(hits, reverse=True)[:k]]


def test_a_client_of_the_server_alone_searches_as_the_store_does(
    backend: BackendSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not is_server_uri(backend.uri):
        pytest.skip("a Milvus server: what other machines reach")
    import os

    rng = np.random.default_rng(3)
    n = 600
    with GalleryStore.create(tmp_path / "s", backend) as store:
        store.ingest(
            [f"i{i}" for i in range(n)], rng.normal(size=(n, OLD.dim)).astype(np.float32), OLD
        )
        job = BackfillJob(
            store,
            NEW,
            TransformStored(lambda v: np.ascontiguousarray(v + 0.1)),
            build_ordering("random"),
            100,
            progress=False,
        )
        for chunks in (2, 1):  # half-way, then a step further: the state follows every commit
            job.run(max_chunks=chunks)
            assert store.status().backfill.status == "running"
            searcher = Searcher(store, build_serving_mode("mixed"))
            prefix = store.backend_settings.collection
            token = os.environ["MILVUS_TOKEN"]
            for query in rng.normal(size=(5, NEW.dim)).astype(np.float32):
                expected = searcher.search(query[None], 10).item_ids[0].tolist()
                assert _outside_search(backend.uri, token, prefix, query, 10) == expected
