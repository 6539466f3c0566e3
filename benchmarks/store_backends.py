"""The gallery store on each vector backend and index: backfill throughput and search latency.

    python -m benchmarks.store_backends [--items 100000] [--dim 128] [--chunk-size 512]
        [--queries 200] [--backends embedded milvus] [--indexes flat hnsw]

For each backend (the embedded float32 files; Milvus Lite in a local file) and index (store.index:
flat, hnsw with its defaults) it prints:
* the time to ingest the gallery;
* backfill items/s of a cheap ψ (a fixed random projection) through the real, crash-safe job, and
  (flat only: the index does not change the backfill's writes on the embedded store) without crash
  safety (``benchmarks.backfill_job.backfill_without_crash_safety``), and their ratio;
* search latency p50/p99 of one query (k = 10, rank-merge with ψ_rev) half-way through the
  backfill and once it is complete (the first search of each stage, which builds the embedded
  store's index for what committed since, is left out and shown as index_s), and recall@10 against
  the embedded flat store's exact answers.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.backfill_job import backfill_without_crash_safety
from modelupgrade.config.store import StoreIndexParams
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


def _gallery(root: Path, settings: BackendSettings, n: int, dim: int) -> GalleryStore:
    rng = np.random.default_rng(0)
    store = GalleryStore.create(root, settings)
    store.ingest(
        [f"item-{i}" for i in range(n)],
        rng.normal(size=(n, dim)).astype(np.float32),
        SpaceSpec("gen0", dim),
        scores={"old-confidence": rng.random(n)},
    )
    return store


def _run(
    root: Path, settings: BackendSettings, n: int, dim: int, chunk: int, queries: np.ndarray
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    new = SpaceSpec("gen1", dim, upgrades_from=("gen0",))
    matrix = np.random.default_rng(2).normal(size=(dim, dim)).astype(np.float32) / np.sqrt(dim)
    figures: dict[str, float] = {}
    answers: dict[str, np.ndarray] = {}
    started = time.perf_counter()
    with _gallery(root / "safe", settings, n, dim) as store:
        figures["ingest_s"] = time.perf_counter() - started
        searcher = Searcher(
            store,
            build_serving_mode("rank-merge-rqt"),
            heads=HeadTransforms(reverse=lambda q: q @ matrix.T),
        )
        job = BackfillJob(
            store,
            new,
            TransformStored(lambda v: v @ matrix),
            build_ordering("old-confidence"),
            chunk,
            progress=False,
        )
        half = max(1, (n // chunk) // 2)
        started = time.perf_counter()
        job.run(max_chunks=half)
        first = time.perf_counter() - started
        for stage in ("half", "complete"):
            if stage == "complete":
                started = time.perf_counter()
                report = job.run()
                safe_s = first + time.perf_counter() - started
                figures["backfill_items_per_s"] = n / safe_s
                if report.status != "complete":
                    raise RuntimeError(f"the benchmark backfill ended {report.status}")
            started = time.perf_counter()
            searcher.search(queries[:1], 10)  # the snapshot, the parts and their indexes, once
            figures[f"index_{stage}_s"] = time.perf_counter() - started
            latencies = []
            hits = []
            for query in queries:
                started = time.perf_counter()
                hits.append(searcher.search(query[None], 10).item_ids[0])
                latencies.append(time.perf_counter() - started)
            figures[f"search_{stage}_p50_ms"] = 1e3 * float(np.percentile(latencies, 50))
            figures[f"search_{stage}_p99_ms"] = 1e3 * float(np.percentile(latencies, 99))
            answers[stage] = np.array(hits)
    if settings.index.kind == "flat":
        with _gallery(root / "unsafe", settings, n, dim) as store:
            unsafe_s = backfill_without_crash_safety(
                store, new, TransformStored(lambda v: v @ matrix), chunk
            )
        figures["backfill_unsafe_items_per_s"] = n / unsafe_s
        figures["crash_safety_cost"] = safe_s / unsafe_s
    return figures, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--chunk-size", type=int, default=512)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--backends", nargs="+", default=["embedded", "milvus"])
    parser.add_argument("--indexes", nargs="+", default=["flat", "hnsw"])
    args = parser.parse_args()
    queries = np.random.default_rng(1).normal(size=(args.queries, args.dim)).astype(np.float32)
    exact: dict[str, np.ndarray] | None = None
    runs = [("embedded", "flat")] + [
        (backend, index)
        for backend in args.backends
        for index in args.indexes
        if (backend, index) != ("embedded", "flat")
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for backend, index in runs:
            settings = BackendSettings(kind=backend, index=StoreIndexParams(kind=index))
            figures, answers = _run(
                Path(tmp) / f"{backend}-{index}",
                settings,
                args.items,
                args.dim,
                args.chunk_size,
                queries,
            )
            if exact is None:
                exact = answers
            for stage, hits in answers.items():
                found = [len(set(h) & set(e)) / 10 for h, e in zip(hits, exact[stage], strict=True)]
                figures[f"recall@10_{stage}"] = float(np.mean(found))
            shown = ", ".join(f"{key} {value:.4g}" for key, value in figures.items())
            print(
                f"{backend} {index} ({args.items} items, {args.dim}-d, chunks of "
                f"{args.chunk_size}): {shown}",
                flush=True,
            )


if __name__ == "__main__":
    main()
