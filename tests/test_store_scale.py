"""Search whose cost does not grow with the gallery (issue 29, item 2): what a search sends to a
vector database has the same size at 1,000 and at 100,000 items (no list of ids: a filter on the
rows' own state against a few ledger facts), and a search of the embedded store reads no part's
rows per query, only each query's candidates."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelupgrade.ordering import build_ordering
from modelupgrade.serving import build_serving_mode
from modelupgrade.store import (
    BackendSettings,
    BackfillJob,
    GalleryStore,
    HeadTransforms,
    Searcher,
    SpaceSpec,
    TransformStored,
)
from modelupgrade.store.backends.embedded import EmbeddedVectors
from modelupgrade.store.backends.milvus import MilvusVectors
from tests.store_helpers import COMPATIBLE_NEW as NEW
from tests.store_helpers import COMPATIBLE_OLD as OLD
from tests.store_helpers import milvus_lite

K = 10


def _half_backfilled(path: Path, n: int, backend: BackendSettings | None = None) -> GalleryStore:
    """``n`` items, half of them (in chunks of 512, a random order) moved into NEW."""
    rng = np.random.default_rng(n)
    store = GalleryStore.create(path, backend)
    store.ingest([f"i{i}" for i in range(n)], rng.normal(size=(n, OLD.dim)).astype(np.float32), OLD)
    job = BackfillJob(
        store,
        NEW,
        TransformStored(lambda v: np.ascontiguousarray(v[:, ::-1])),
        build_ordering("random"),
        512,
        progress=False,
    )
    job.run(max_chunks=max(1, n // 1024))
    return store


def test_a_part_s_filter_is_the_same_size_at_1000_and_100000_items(tmp_path: Path) -> None:
    sizes = {}
    for n in (1000, 100_000):
        with _half_backfilled(tmp_path / str(n), n) as store:
            snapshot = store.snapshot()
            assert 0 < store.status().backfill.done < n
            parts = snapshot.partitions()
            assert set(parts) == {OLD.name, NEW.name}
            sizes[n] = {space: _shape(snapshot.filters[space]) for space in parts}
    # the same expression, its numbers aside (the slot counter, the frontier chunk)
    assert sizes[1000] == sizes[100_000], sizes
    assert max(len(shape) for shape in sizes[100_000].values()) < 200


def _shape(expression: str) -> str:
    return re.sub(r"\d+", "#", expression)


class _Recording:
    """Wraps a Milvus client: keeps each search's filter and the bytes of its request."""

    def __init__(self, client: Any) -> None:
        self.client, self.searches = client, []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)
        if name != "search":
            return method

        def search(collection: str, **kwargs: Any) -> Any:
            data = np.asarray(kwargs["data"], np.float32)
            self.searches.append((kwargs["filter"], len(kwargs["filter"]) + data.nbytes))
            return method(collection, **kwargs)

        return search


def test_what_a_search_sends_to_milvus_does_not_grow_with_the_gallery(
    backend: BackendSettings, tmp_path: Path
) -> None:
    if backend.kind != "milvus":
        pytest.skip("a vector database's requests")
    sent: dict[int, list[tuple[str, int]]] = {}
    heads = HeadTransforms()
    query = np.random.default_rng(0).normal(size=(1, NEW.dim)).astype(np.float32)
    for n in (1000, 5000):
        with _half_backfilled(tmp_path / str(n), n, backend) as store:
            assert isinstance(store.vectors, MilvusVectors)
            recording = _Recording(store.vectors.client())
            store.vectors._client = recording
            searcher = Searcher(store, build_serving_mode("mixed"), heads=heads)
            hits = searcher.search(query, K)
            assert len(set(hits.item_ids[0])) == K
            snapshot = searcher.snapshot()
            sent[n] = recording.searches
            assert sorted(f for f, _ in sent[n]) == sorted(snapshot.filters.values())
            # the filters pick each part's rows, no more, no fewer
            client = recording.client
            for space, positions in snapshot.partitions().items():
                spec = store.space(space)
                rows = client.query(
                    store.vectors.collection(spec),
                    filter=snapshot.filters[space],
                    output_fields=["slot"],
                    limit=16384,
                    **store.vectors._consistency(),
                )
                assert sorted(r["slot"] for r in rows) == snapshot.slots[positions].tolist()
            if milvus_lite(backend):
                store.vectors.close()
    assert len(sent[1000]) == len(sent[5000]) == 2  # one request per part
    shapes = {
        n: sorted((_shape(f), b - len(f)) for f, b in requests) for n, requests in sent.items()
    }
    assert shapes[1000] == shapes[5000], sent
    assert all(len(f) < 200 for requests in sent.values() for f, _ in requests)


def test_an_embedded_search_reads_each_query_s_candidates_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[int] = []
    original = EmbeddedVectors.read

    def counted(self: EmbeddedVectors, spec: SpaceSpec, slots: np.ndarray) -> np.ndarray:
        read.append(len(slots))
        return original(self, spec, slots)

    monkeypatch.setattr(EmbeddedVectors, "read", counted)
    rows_per_query = {}
    queries = np.random.default_rng(1).normal(size=(4, NEW.dim)).astype(np.float32)
    for n in (1000, 100_000):
        with _half_backfilled(tmp_path / str(n), n) as store:
            searcher = Searcher(store, build_serving_mode("mixed"))
            searcher.search(queries[:1], K)  # the snapshot's parts made ready once
            read.clear()
            for query in queries:
                hits = searcher.search(query[None], K)
                assert len(set(hits.item_ids[0])) == K
            rows_per_query[n] = sum(read) / len(queries)
    # k + max(k, 16) candidates per part, two parts: nothing proportional to the gallery
    assert rows_per_query[100_000] == rows_per_query[1000] <= 2 * (K + 16)


def test_milvus_lite_flushes_a_chunk_s_rewritten_source_rows_with_the_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Milvus Lite searches unflushed rows through its memtable, converting each to a Python list
    per search: the source rows a chunk rewrites (their move recorded) must be flushed with the
    chunk, as its new rows are, or a half-way search slows with every chunk (20,000 items: p99
    499 ms unflushed, 64 ms flushed, benchmarks/store_backends)."""
    pytest.importorskip("milvus_lite")
    synced: list[str] = []
    real_sync = MilvusVectors.sync

    def recording(self: MilvusVectors, spec: SpaceSpec) -> None:
        synced.append(spec.name)
        real_sync(self, spec)

    monkeypatch.setattr(MilvusVectors, "sync", recording)
    with _half_backfilled(tmp_path / "s", 4096, BackendSettings(kind="milvus")) as store:
        chunks = len(store.backfills.chunk_log())
    assert chunks == 4
    # The ingest's flush of the source, then one per chunk for its moved items' source rows; the
    # target's new rows are flushed once per group of chunks the job commits together.
    assert synced.count(OLD.name) >= 1 + chunks and NEW.name in synced, synced
