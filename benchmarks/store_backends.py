"""The gallery store on each vector backend and index, at a size: search at rest and half-way
through a backfill against the raw engine searching one collection, live writes, the backfill.

    python -m benchmarks.store_backends --items 100000 [--dim 128] [--queries 200]
        [--backends embedded milvus milvus-server] [--indexes flat hnsw]
        [--milvus-uri http://127.0.0.1:19530]   # a running server; its token from $MILVUS_TOKEN

The gallery is clustered (1,000 Gaussian clusters of unit-variance centres and spread 0.35 in 128
dimensions; the queries drawn the same way), the new model a fixed random rotation of the old space
plus noise (ψ), trained backward compatible, so ``mixed`` compares new queries with stored old
vectors and ``rank-merge`` searches the old part with the old query. For each backend and index it
prints, in one line:

* ``ingest_items_per_s``; ``backfill_items_per_s`` of the crash-safe job (ψ, chunks of 512);
* search latency of one query, k = 10, p50/p99 in ms: ``raw`` (FAISS, or pymilvus on one
  collection, the same vectors and index, no store), ``rest`` (the store before the backfill: one
  space), ``half_mixed`` and ``half_rank_merge`` (half the items moved), ``done`` (one space again);
  and their ratio half/rest (the goal: ≤ 2 at 1,000,000 items);
* ``recall@10`` against exact search of the same state (1.0 for flat) and the HNSW ``ef`` it took;
* live writes half-way through the backfill: ``ingest_live_items_per_s`` (10,000 items that join
  the backfill) and ``erase_items_per_s`` (1,000 items, their vectors destroyed in every space).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from modelupgrade.config.store import StoreIndexParams
from modelupgrade.ordering import build_ordering
from modelupgrade.retrieval.index import INDEXES, SearchOptions, normalised_float32
from modelupgrade.serving import build_serving_mode
from modelupgrade.store import (
    BackendSettings,
    BackfillJob,
    GalleryStore,
    QueryVectors,
    Searcher,
    SpaceSpec,
    TransformStored,
)
from modelupgrade.store.live import erase

CLUSTERS, SPREAD, K = 1000, 0.35, 10


def clustered(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(size=(CLUSTERS, dim))
    return (centres[rng.integers(0, CLUSTERS, n)] + SPREAD * rng.normal(size=(n, dim))).astype(
        np.float32
    )


def _psi(dim: int) -> Callable[[np.ndarray], np.ndarray]:
    rotation, _ = np.linalg.qr(np.random.default_rng(2).normal(size=(dim, dim)))
    rotation = (0.9 * np.eye(dim) + 0.1 * rotation).astype(np.float32)
    return lambda v: np.ascontiguousarray(np.asarray(v, np.float32) @ rotation)


def _timed(search: Callable[[np.ndarray], Any], queries: np.ndarray) -> tuple[float, float, list]:
    search(queries[:1])  # one first: whatever a search builds once is not a query's cost
    latencies, found = [], []
    for query in queries:
        started = time.perf_counter()
        found.append(search(query[None]))
        latencies.append(time.perf_counter() - started)
    p50, p99 = (1e3 * float(np.percentile(latencies, q)) for q in (50, 99))
    return p50, p99, found


def _raw_faiss(vectors: np.ndarray, index: StoreIndexParams) -> Callable[[np.ndarray], Any]:
    options = SearchOptions(
        index=index.kind,
        use_gpu="never",
        hnsw_m=index.hnsw_m,
        hnsw_ef_construction=index.hnsw_ef_construction,
        hnsw_ef_search=index.hnsw_ef_search,
        metric="ip",
    )
    built = INDEXES.get(index.kind)(vectors.shape[1], options)
    built.add(normalised_float32(vectors))
    return lambda q: built.search(normalised_float32(q), K)[1][0]


def _raw_milvus(store: GalleryStore, index: StoreIndexParams) -> Callable[[np.ndarray], Any]:
    vectors = store.vectors
    client, name = vectors.client(), vectors.collection(store.space("gen0"))
    params = {"ef": max(index.hnsw_ef_search, K)} if index.kind == "hnsw" else {}
    return lambda q: client.search(
        name,
        data=[row.tolist() for row in q],
        anns_field="vector",
        limit=K,
        search_params={"metric_type": "COSINE", "params": params},
        **vectors._consistency(),
    )


def _store_search(searcher: Searcher, psi: Callable[[np.ndarray], np.ndarray]) -> Callable:
    return lambda q: searcher.search(QueryVectors(psi(q), q), K).item_ids[0]


def run(
    root: Path, settings: BackendSettings, n: int, dim: int, queries: np.ndarray
) -> dict[str, float]:
    old, psi = SpaceSpec("gen0", dim), _psi(dim)
    new = SpaceSpec("gen1", dim, upgrades_from=("gen0",), backward_compatible=True)
    figures: dict[str, float] = {}
    vectors = clustered(n, dim, 1)
    started = time.perf_counter()
    store = GalleryStore.create(root, settings)
    for start in range(0, n, 100_000):
        part = vectors[start : start + 100_000]
        store.ingest([f"i{i}" for i in range(start, start + len(part))], part, old)
    figures["ingest_items_per_s"] = n / (time.perf_counter() - started)
    index = settings.index
    raw = _raw_faiss(vectors, index) if settings.kind == "embedded" else _raw_milvus(store, index)
    figures["raw_p50_ms"], figures["raw_p99_ms"], _ = _timed(raw, psi(queries))
    mixed = Searcher(store, build_serving_mode("mixed"))
    figures["rest_p50_ms"], figures["rest_p99_ms"], _ = _timed(
        lambda q: mixed.search(q, K).item_ids[0], queries
    )
    job = BackfillJob(
        store, new, TransformStored(psi), build_ordering("random"), 512, progress=False
    )
    started = time.perf_counter()
    job.run(max_chunks=n // 1024)
    half_s = time.perf_counter() - started
    for name, mode in (("half_mixed", "mixed"), ("half_rank_merge", "rank-merge")):
        searcher = Searcher(store, build_serving_mode(mode))
        p50, p99, found = _timed(_store_search(searcher, psi), queries)
        figures[f"{name}_p50_ms"], figures[f"{name}_p99_ms"] = p50, p99
        if mode == "mixed":
            figures["recall@10_half"] = _recall(store, psi(queries), found)
    figures["half_over_rest_p99"] = figures["half_mixed_p99_ms"] / figures["rest_p99_ms"]
    live = clustered(10_000, dim, 3)
    started = time.perf_counter()
    store.ingest([f"live{i}" for i in range(len(live))], live, old)
    figures["ingest_live_items_per_s"] = len(live) / (time.perf_counter() - started)
    started = time.perf_counter()
    erase(store, [f"i{i}" for i in range(0, n, n // 1000)][:1000], "benchmark")
    figures["erase_items_per_s"] = 1000 / (time.perf_counter() - started)
    started = time.perf_counter()
    report = job.run()
    if report.status != "complete":
        raise RuntimeError(f"the benchmark backfill ended {report.status}")
    figures["backfill_items_per_s"] = (n + len(live) - 1000) / (
        half_s + time.perf_counter() - started
    )
    searcher = Searcher(store, build_serving_mode("mixed"))
    figures["done_p50_ms"], figures["done_p99_ms"], found = _timed(
        _store_search(searcher, psi), queries
    )
    figures["recall@10_done"] = _recall(store, psi(queries), found)
    if index.kind == "hnsw":
        figures["hnsw_ef"] = index.hnsw_ef_search
    store.close()
    return figures


def _recall(store: GalleryStore, queries: np.ndarray, found: list) -> float:
    """recall@10 of ``found`` against an exact search of the store's state (each part's stored
    vectors scanned; the new query meets the old vectors directly: the model is compatible)."""
    snapshot = store.snapshot()
    scores, ids = [], []
    for space, positions in snapshot.partitions().items():
        slots = snapshot.slots[positions]
        for start in range(0, len(slots), 200_000):
            part = slots[start : start + 200_000]
            gallery = normalised_float32(store.read_vectors(space, part))
            scores.append(normalised_float32(queries) @ gallery.T)
            ids.append(snapshot.item_ids[positions][start : start + 200_000])
    every, names = np.concatenate(scores, axis=1), np.concatenate(ids)
    exact = names[np.argsort(-every, axis=1)[:, :K]]
    return float(np.mean([len(set(f) & set(e)) / K for f, e in zip(found, exact, strict=True)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--backends", nargs="+", default=["embedded", "milvus"])
    parser.add_argument("--indexes", nargs="+", default=["flat", "hnsw"])
    parser.add_argument("--milvus-uri", default="", help="a Milvus server for milvus-server")
    parser.add_argument("--root", type=Path, default=None, help="where the stores go")
    args = parser.parse_args()
    if args.root is not None:
        args.root.mkdir(parents=True, exist_ok=True)
    queries = clustered(args.queries, args.dim, 9)
    print(f"machine load before: {os.getloadavg()[0]:.1f} (1-minute average)", flush=True)
    with tempfile.TemporaryDirectory(dir=args.root) as tmp:
        for backend in args.backends:
            for index in args.indexes:
                kind = "milvus" if backend.startswith("milvus") else backend
                uri = args.milvus_uri if backend == "milvus-server" else ""
                settings = BackendSettings(kind=kind, uri=uri, index=StoreIndexParams(kind=index))
                began = time.perf_counter()
                figures = run(
                    Path(tmp) / f"{backend}-{index}", settings, args.items, args.dim, queries
                )
                shown = ", ".join(f"{key} {value:.4g}" for key, value in figures.items())
                print(
                    f"{backend} {index} ({args.items} items, {args.dim}-d, clustered): {shown}; "
                    f"{time.perf_counter() - began:.0f} s, load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
