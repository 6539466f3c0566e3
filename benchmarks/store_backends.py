"""The gallery store on each vector backend: backfill throughput and search latency.

    python -m benchmarks.store_backends [--items 20000] [--dim 128] [--chunk-size 512]
        [--queries 200] [--backends embedded milvus]

For each backend (the embedded float32 files; Milvus Lite in a local file) it prints:
* the time to open the backend and ingest the gallery;
* backfill items/s of a cheap ψ (a fixed random projection) through the real, crash-safe job;
* search latency p50/p99 of one query (k = 10, rank-merge with ψ_rev) half-way through the
  backfill and once it is complete, and recall@10 against the embedded store's exact answers
  (1.0 for a FLAT index: the same items).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

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


def _run(
    root: Path, kind: str, n: int, dim: int, chunk: int, queries: np.ndarray
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    old, new = SpaceSpec("gen0", dim), SpaceSpec("gen1", dim, upgrades_from=("gen0",))
    matrix = rng.normal(size=(dim, dim)).astype(np.float32) / np.sqrt(dim)
    figures: dict[str, float] = {}
    answers: dict[str, np.ndarray] = {}
    started = time.perf_counter()
    with GalleryStore.create(root / kind, BackendSettings(kind=kind)) as store:
        store.ingest(
            [f"item-{i}" for i in range(n)],
            rng.normal(size=(n, dim)).astype(np.float32),
            old,
            scores={"old-confidence": rng.random(n)},
        )
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
                figures["backfill_items_per_s"] = n / (first + time.perf_counter() - started)
                if report.status != "complete":
                    raise RuntimeError(f"the benchmark backfill ended {report.status}")
            searcher.search(queries[:1], 10)  # the snapshot and the parts, once
            latencies = []
            hits = []
            for query in queries:
                started = time.perf_counter()
                hits.append(searcher.search(query[None], 10).item_ids[0])
                latencies.append(time.perf_counter() - started)
            figures[f"search_{stage}_p50_ms"] = 1e3 * float(np.percentile(latencies, 50))
            figures[f"search_{stage}_p99_ms"] = 1e3 * float(np.percentile(latencies, 99))
            answers[stage] = np.array(hits)
    return figures, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=20000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--chunk-size", type=int, default=512)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--backends", nargs="+", default=["embedded", "milvus"])
    args = parser.parse_args()
    queries = np.random.default_rng(1).normal(size=(args.queries, args.dim)).astype(np.float32)
    exact: dict[str, np.ndarray] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ["embedded", *[b for b in args.backends if b != "embedded"]]:
            figures, answers = _run(Path(tmp), kind, args.items, args.dim, args.chunk_size, queries)
            if exact is None:
                exact = answers
            for stage, hits in answers.items():
                found = [len(set(h) & set(e)) / 10 for h, e in zip(hits, exact[stage], strict=True)]
                figures[f"recall@10_{stage}"] = float(np.mean(found))
            shown = ", ".join(f"{key} {value:.4g}" for key, value in figures.items())
            print(
                f"{kind} ({args.items} items, {args.dim}-d, chunks of {args.chunk_size}): {shown}"
            )


if __name__ == "__main__":
    main()
