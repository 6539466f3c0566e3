"""Backfill job throughput and the cost of crash safety.

    python -m benchmarks.backfill_job [--items 20000] [--dim 128] [--chunk-size 512] [--images 512]

Prints items/s for
* ψ on stored vectors (a BiCT-style MLP head, on the CPU and on CUDA when present), through the real
  job: a chunk's vectors made durable (in the space's journal) before its state is committed,
  commits on a writer thread that overlaps the next chunks' compute and groups the chunks that
  finished meanwhile (group commit), and the checkpoint when the job lets go of the store;
* the same chunks and ψ *without* crash safety: one thread, rows written in place and synced once
  at the end, one state transaction — the ratio of the two is the cost of crash safety (target
  ≤ 1.10);
* re-embedding images with a small real EmbeddingModel (ResNet-18, 28×28, CPU; and
  CUDA when present).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from modelupgrade.ordering import build_ordering
from modelupgrade.store import (
    BackfillJob,
    GalleryStore,
    LoadedImages,
    ReEmbedImages,
    SpaceSpec,
    TransformStored,
    start_or_resume,
)
from modelupgrade.store.backends.embedded import EmbeddedVectors
from modelupgrade.store.schema import VECTORS_DIR
from modelupgrade.store.vectors import VectorFile, vector_checksums


def build_gallery(path: Path, n: int, space: SpaceSpec) -> GalleryStore:
    """``n`` items item-00000 … with random ``space`` vectors and an old-confidence score each,
    their vectors in the embedded backend."""
    rng = np.random.default_rng(0)
    store = GalleryStore.create(path)
    store.ingest(
        [f"item-{i:05d}" for i in range(n)],
        rng.normal(size=(n, space.dim)).astype(np.float32),
        space,
        scores={"old-confidence": rng.random(n)},
    )
    return store


def _psi(dim: int, hidden: int, depth: int, device: str):  # type: ignore[no-untyped-def]
    from modelupgrade.heads import FrozenHead, build_head

    return FrozenHead(build_head("bict", dim, dim, hidden, depth).eval(), device).output()


# Seconds spent in the ledger's chunk-commit transactions, per run (what recording progress per
# chunk rather than per item row changes).
COMMIT_SECONDS: list[float] = []


def _timed_commits(store: GalleryStore) -> None:
    COMMIT_SECONDS.append(0.0)
    commit_chunks = store.backfills.commit_chunks

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        commit_chunks(*args, **kwargs)
        COMMIT_SECONDS[-1] += time.perf_counter() - started

    store.backfills.commit_chunks = timed  # type: ignore[method-assign]


def _crash_safe(path: Path, n: int, old: SpaceSpec, new: SpaceSpec, chunk: int, psi) -> float:  # type: ignore[no-untyped-def]
    with build_gallery(path, n, space=old) as store:
        _timed_commits(store)
        started = time.perf_counter()
        report = BackfillJob(
            store,
            new,
            TransformStored(psi),
            build_ordering("old-confidence"),
            chunk,
            progress=False,
        ).run()
        if report.status != "complete":
            raise RuntimeError(f"benchmark backfill ended {report.status}: {report.as_dict()}")
        return time.perf_counter() - started


def _unsafe(path: Path, n: int, old: SpaceSpec, new: SpaceSpec, chunk: int, psi) -> float:  # type: ignore[no-untyped-def]
    with build_gallery(path, n, space=old) as store:
        _timed_commits(store)
        return backfill_without_crash_safety(store, new, TransformStored(psi), chunk)


def _writes_without_durability(
    store: GalleryStore, space: SpaceSpec
) -> tuple[Callable[[np.ndarray, np.ndarray], None], Callable[[], None]]:
    """(write, sync) for a backfill that makes nothing durable until the end: on the embedded
    backend its rows and checksums written in place in the space's files
    (``modelupgrade.store.schema``) with no journal, one sync of each file; on another backend its
    own upserts and one sync."""
    if not isinstance(store.vectors, EmbeddedVectors):
        return (
            lambda slots, vectors: store.write_vectors(space.name, slots, vectors, durable=False),
            lambda: store.sync_vectors(space.name),
        )
    rows = VectorFile(store.path / VECTORS_DIR / f"{space.name}.f32", space.dim)
    sums = VectorFile(store.path / VECTORS_DIR / f"{space.name}.sum", 1, np.uint64)

    def write(slots: np.ndarray, vectors: np.ndarray) -> None:
        rows.write(slots, vectors, durable=False)
        sums.write(slots, vector_checksums(vectors).reshape(-1, 1), durable=False)

    def sync() -> None:
        rows.sync()
        sums.sync()

    return write, sync


def backfill_without_crash_safety(
    store: GalleryStore, new: SpaceSpec, source: TransformStored, chunk: int
) -> float:
    """Seconds to backfill ``store`` with the same chunks and ψ as the job, with nothing made
    durable until the end (the baseline of the crash-safety cost): every chunk's vectors written,
    one sync, then every chunk's state in one transaction."""
    started = time.perf_counter()
    backfill = start_or_resume(store, new, "transform", build_ordering("old-confidence"), chunk)
    write, sync = _writes_without_durability(store, new)
    results = []
    # nothing committed in between
    for chunk_rows in store.backfills.next_chunks(backfill, limit=None):
        result = source.compute(store, chunk_rows, new)
        write(result.slots, result.vectors)
        results.append((chunk_rows, result))
    # every state in one transaction
    sync()
    store.backfills.commit_chunks(
        new.name, [result.commit_of(chunk_rows) for chunk_rows, result in results]
    )
    store.backfills.finish(backfill)
    return time.perf_counter() - started


class _SyntheticImages:
    def __init__(self, shape: tuple[int, ...]) -> None:
        self.rng = np.random.default_rng(0)
        self.shape = shape

    def load(self, items):  # type: ignore[no-untyped-def]
        images = self.rng.integers(0, 255, (len(items), *self.shape), dtype=np.uint8)
        return LoadedImages(images, np.array([i.slot for i in items], dtype=np.int64))


def _re_embed(path: Path, n: int, chunk: int, device: str) -> float:
    from modelupgrade.config.training import ArchitectureParams
    from modelupgrade.models import EmbeddingModel, embed

    model = (
        EmbeddingModel(ArchitectureParams(backbone="resnet18", embedding_dim=128), 1, 10, 28)
        .eval()
        .to(device)
    )
    old, new = SpaceSpec("gen0", 128), SpaceSpec("gen1", 128, upgrades_from=("gen0",))
    with build_gallery(path, n, space=old) as store:
        source = ReEmbedImages(
            _SyntheticImages((1, 28, 28)),
            lambda images: embed(model, torch.from_numpy(images), 256, device),
        )
        started = time.perf_counter()
        report = BackfillJob(
            store, new, source, build_ordering("random"), chunk, progress=False
        ).run()
        assert report.status == "complete"
        return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=20000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--chunk-size", type=int, default=512)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--head-hidden", type=int, default=256)
    parser.add_argument("--head-depth", type=int, default=2)
    args = parser.parse_args()
    old = SpaceSpec("gen0", args.dim)
    new = SpaceSpec("gen1", args.dim, upgrades_from=("gen0",))
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    with tempfile.TemporaryDirectory(prefix="backfill-bench-") as tmp:
        for device in devices:
            psi = _psi(args.dim, args.head_hidden, args.head_depth, device)
            safe, unsafe, safe_commits, unsafe_commits = [], [], [], []
            for repeat in range(args.repeats):  # interleaved so machine load hits both alike
                safe.append(
                    _crash_safe(
                        Path(tmp) / f"safe-{device}{repeat}",
                        args.items,
                        old,
                        new,
                        args.chunk_size,
                        psi,
                    )
                )
                safe_commits.append(COMMIT_SECONDS[-1])
                unsafe.append(
                    _unsafe(
                        Path(tmp) / f"unsafe-{device}{repeat}",
                        args.items,
                        old,
                        new,
                        args.chunk_size,
                        psi,
                    )
                )
                unsafe_commits.append(COMMIT_SECONDS[-1])
            best_safe, best_unsafe = min(safe), min(unsafe)
            print(
                f"ψ on stored vectors (bict head {args.head_depth}×{args.head_hidden}, "
                f"d={args.dim}, {args.items} items, chunks of {args.chunk_size}, ψ on {device}):"
            )
            print(
                f"  crash-safe job : {args.items / best_safe:10.0f} items/s  ({best_safe:.3f} s, "
                f"best of {args.repeats})"
            )
            print(
                f"  without        : {args.items / best_unsafe:10.0f} items/s  "
                f"({best_unsafe:.3f} s)"
            )
            print(f"  cost of crash safety: {best_safe / best_unsafe:.3f}x (target ≤ 1.10)")
            print(
                f"  ledger commits: {min(safe_commits):.3f} s (crash-safe, a transaction per "
                f"group of chunks) vs {min(unsafe_commits):.3f} s (one transaction)"
            )
        for device in devices:
            rate = _re_embed(
                Path(tmp) / f"embed-{device}",
                args.images,
                min(args.chunk_size, args.images),
                device,
            )
            print(
                f"re-embedding images (ResNet-18, 1×28×28 → 128-d, {args.images} items, "
                f"{device}): {rate:.1f} items/s"
            )


if __name__ == "__main__":
    main()
