"""The gallery store's backfill on Ray Data: the plan's chunks computed by a pool of workers.

    python -m modelupgrade.scale.ray_backfill --store stores/demo \
        --model models/extended-data/gen1-bct
    python -m modelupgrade.scale.ray_backfill --store stores/demo --transform-head heads/gen1/bict \
        --space gen1-bict --address auto

(``pip install .[scale]``.) This is ``modelupgrade backfill`` with its chunks computed in parallel:

- the plan is the store's own (``start_or_resume``): the policy's order cut into fixed chunks in one
  transaction. A chunk is the unit of work, of writing and of resuming;
- Ray Data streams the pending chunks, one block each, through a pool of actors that load the new
  model or ψ once (one GPU each when the cluster has GPUs, CPUs otherwise) and compute a chunk's
  vectors with the single-process job's own ``VectorSource``: decode the images and embed them in
  batches (``embed``), or read the stored vectors and apply ψ in batches (``transform``);
- this process alone writes, as ``BackfillJob`` does: a computed chunk goes into its slots of the
  target space's float32 file, is made durable, then is committed in one SQLite transaction with its
  digest in the chunk log. A killed job leaves every uncommitted chunk pending, and the next run
  computes only those; each item's vector comes from one committed chunk and is the vector the
  single-process job writes.

Chunks commit in the order they finish, which follows the plan's order up to the pool's width.
The workers open the store and the images at the paths this process uses: on a cluster, both go on
a filesystem that every node mounts at the same path. SIGTERM stops the job at the next chunk
boundary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
from tqdm.auto import tqdm

from modelupgrade.errors import UserError, exit_on_user_error
from modelupgrade.store.backfill import (
    BackfillReport,
    ReEmbedImages,
    TransformStored,
    VectorSource,
    start_or_resume,
    vectors_digest,
)
from modelupgrade.store.gallery import DATABASE_FILE, SCHEMA_VERSION, Backfill, Chunk, GalleryStore
from modelupgrade.store.images import ImageSource
from modelupgrade.store.policies import OrderingPolicy
from modelupgrade.store.spaces import SpaceSpec

log = logging.getLogger(__name__)

# The item table's columns that this module reads; written for this schema version of the store.
_READS_SCHEMA_VERSION = 1


class VectorRecipe(Protocol):
    """What a worker loads once and how it computes a chunk's vectors; shipped to every worker."""

    method: ClassVar[str]

    def check(self) -> None:
        """Raise a ``UserError`` here, before any worker starts, if what it names is missing."""

    def build(self, device: str) -> VectorSource: ...


@dataclass(frozen=True)
class ModelVectors:
    """Re-embed each item's image with the model saved in ``model_dir`` (method ``embed``)."""

    model_dir: str
    images: ImageSource
    batch_size: int = 256
    method: ClassVar[str] = "embed"

    def check(self) -> None:
        from modelupgrade.models import read_model_card

        read_model_card(self.model_dir)

    def build(self, device: str) -> VectorSource:
        from modelupgrade.store.models import model_embed_fn

        return ReEmbedImages(self.images, model_embed_fn(self.model_dir, self.batch_size, device))


@dataclass(frozen=True)
class HeadVectors:
    """Apply the forward head ψ saved in ``head_dir`` to stored vectors (method ``transform``)."""

    head_dir: str
    method: ClassVar[str] = "transform"

    def check(self) -> None:
        from modelupgrade.heads import read_head_card

        read_head_card(self.head_dir)

    def build(self, device: str) -> VectorSource:
        from modelupgrade.store.models import head_transform_fn

        transform, _ = head_transform_fn(self.head_dir, device)
        return TransformStored(transform)


def pending_chunks(store: GalleryStore, backfill: Backfill) -> list[tuple[int, np.ndarray]]:
    """Every chunk of ``backfill`` with pending items: (chunk index, their slots in plan order).

    The store hands out one chunk at a time (``next_chunk``), the one a single job works on; a pool
    of workers needs all of them at once, so they are read from the item table, in a read-only
    connection of their own.
    """
    if SCHEMA_VERSION != _READS_SCHEMA_VERSION:
        raise RuntimeError(
            f"pending_chunks reads store schema {_READS_SCHEMA_VERSION}, not {SCHEMA_VERSION}"
        )
    uri = f"{(store.path / DATABASE_FILE).resolve().as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        rows = db.execute(
            "SELECT planned_chunk, slot FROM items WHERE backfill_id = ? AND state = 'pending' "
            "ORDER BY planned_chunk, backfill_rank",
            (backfill.id,),
        ).fetchall()
    if not rows:
        return []
    table = np.array(rows, dtype=np.int64)
    starts = np.flatnonzero(np.diff(table[:, 0], prepend=table[0, 0] - 1))
    return [
        (int(table[s, 0]), table[s:e, 1].copy())
        for s, e in zip(starts, [*starts[1:], len(table)], strict=True)
    ]


def _chunk(store: GalleryStore, backfill_id: int, index: int, slots: np.ndarray) -> Chunk:
    """The chunk as ``next_chunk`` returns it: its items in plan order."""
    by_slot = {item.slot: item for item in store.items(slots.tolist())}
    return Chunk(backfill_id, index, tuple(by_slot[int(slot)] for slot in slots))


class ChunkWorker:
    """A Ray Data actor: the recipe's ``VectorSource`` built once, then one chunk per row."""

    def __init__(
        self,
        store_path: str,
        backfill_id: int,
        target: SpaceSpec,
        recipe: VectorRecipe,
        device: str,
    ) -> None:
        self.store = GalleryStore.open(store_path)
        self.backfill_id, self.target = backfill_id, target
        self.source = recipe.build(device)

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        chunk = _chunk(
            self.store,
            self.backfill_id,
            int(row["chunk"]),
            np.frombuffer(row["slots"], dtype=np.int64),
        )
        try:
            result = self.source.compute(self.store, chunk, self.target)
        except UserError as err:
            # Ray would wrap it in its own exception, and pickling drops the cause: sent as data
            # instead, so the caller raises the same UserError.
            return {
                "chunk": chunk.index,
                "slots": b"",
                "vectors": b"",
                "failures": "{}",
                "user_error": json.dumps({"message": err.message, "hint": err.hint}),
            }
        return {
            "chunk": chunk.index,
            "slots": np.ascontiguousarray(result.slots, dtype=np.int64).tobytes(),
            "vectors": np.ascontiguousarray(result.vectors, dtype=np.float32).tobytes(),
            "failures": json.dumps({str(slot): reason for slot, reason in result.failures.items()}),
            "user_error": "",
        }


@dataclass(frozen=True)
class WorkerPool:
    """How many actors compute chunks, and what each one holds."""

    workers: int
    gpus_per_worker: float
    cpus_per_worker: float

    @property
    def device(self) -> str:
        # Ray gives an actor with a GPU its own CUDA_VISIBLE_DEVICES: "cuda" is that GPU.
        return "cuda" if self.gpus_per_worker > 0 else "cpu"

    @classmethod
    def for_cluster(
        cls,
        workers: int | None = None,
        gpus_per_worker: float | None = None,
        cpus_per_worker: float = 1.0,
    ) -> WorkerPool:
        """Defaults from the cluster: one worker per GPU, or one per ``cpus_per_worker`` CPUs.

        Without a connected cluster, a local one is started, as Ray Data itself does on first use.
        """
        import ray

        if not ray.is_initialized():
            ray.init(include_dashboard=False)
        resources = ray.cluster_resources()
        gpus, cpus = resources.get("GPU", 0.0), resources.get("CPU", 1.0)
        if gpus_per_worker is None:
            gpus_per_worker = 1.0 if gpus >= 1 else 0.0
        if cpus_per_worker <= 0 or gpus_per_worker < 0:
            raise UserError(
                f"a worker needs > 0 CPUs and ≥ 0 GPUs, got {cpus_per_worker} and {gpus_per_worker}"
            )
        if gpus_per_worker > gpus:
            raise UserError(
                f"a worker asks for {gpus_per_worker} GPU(s), the Ray cluster has {gpus}",
                hint="--gpus-per-worker 0 computes on CPUs; --address joins a cluster with GPUs",
            )
        if workers is None:
            workers = max(
                1, int(gpus / gpus_per_worker if gpus_per_worker else cpus / cpus_per_worker)
            )
        if workers < 1:
            raise UserError(f"the backfill needs at least one worker, got {workers}")
        return cls(workers, gpus_per_worker, cpus_per_worker)


def _stop_on_sigterm(stop: threading.Event) -> Callable[[], None]:
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    return lambda: signal.signal(signal.SIGTERM, previous)


def run_ray_backfill(
    store: GalleryStore,
    target: SpaceSpec,
    recipe: VectorRecipe,
    policy: OrderingPolicy,
    chunk_size: int,
    pool: WorkerPool | None = None,
    max_chunks: int | None = None,
    progress: bool = True,
) -> BackfillReport:
    """Run (or resume) the store's backfill into ``target``, its chunks computed on Ray.

    ``pool`` defaults to ``WorkerPool.for_cluster()``. ``max_chunks`` stops after that many commits
    (status ``paused``; the next call resumes).
    """
    import ray

    recipe.check()
    backfill = start_or_resume(store, target, recipe.method, policy, chunk_size)
    chunks = pending_chunks(store, backfill)
    chunk_slots = dict(chunks)
    pool = pool or WorkerPool.for_cluster()
    started = time.perf_counter()
    committed = written = failed = 0
    stopped, paused = False, max_chunks is not None and max_chunks <= 0
    before = store.status().backfill or {}
    bar = tqdm(
        total=backfill.total,
        initial=before.get("done", 0) + before.get("failed", 0),
        unit="item",
        desc=f"backfill → {target.name} on Ray",
        disable=not progress,
        dynamic_ncols=True,
    )
    stop = threading.Event()
    restore_sigterm = _stop_on_sigterm(stop)
    log.info(
        "backfill %d: %d pending chunk(s) on %d Ray worker(s) (%s)",
        backfill.id,
        len(chunks),
        min(pool.workers, max(len(chunks), 1)),
        pool.device,
    )
    try:
        if chunks and not paused:
            rows = [{"chunk": index, "slots": slots.tobytes()} for index, slots in chunks]
            computed = ray.data.from_items(rows, override_num_blocks=len(rows)).map(
                ChunkWorker,
                fn_constructor_kwargs={
                    "store_path": str(store.path),
                    "backfill_id": backfill.id,
                    "target": target,
                    "recipe": recipe,
                    "device": pool.device,
                },
                compute=ray.data.ActorPoolStrategy(size=min(pool.workers, len(rows))),
                num_cpus=pool.cpus_per_worker,
                num_gpus=pool.gpus_per_worker,
            )
            for row in computed.iter_rows():
                if row["user_error"]:
                    raise UserError(**json.loads(row["user_error"]))
                chunk = _chunk(
                    store, backfill.id, int(row["chunk"]), chunk_slots[int(row["chunk"])]
                )
                slots = np.frombuffer(row["slots"], dtype=np.int64)
                vectors = np.frombuffer(row["vectors"], dtype=np.float32).reshape(
                    len(slots), target.dim
                )
                failures = {
                    int(slot): reason for slot, reason in json.loads(row["failures"]).items()
                }
                store.write_vectors(target.name, slots, vectors, durable=True)
                store.commit_chunk(
                    chunk, target.name, slots, failures, vectors_digest(slots, vectors)
                )
                for slot, reason in failures.items():
                    log.warning(
                        "item %s skipped: %s",
                        next(i.item_id for i in chunk.items if i.slot == slot),
                        reason,
                    )
                committed += 1
                written += len(slots)
                failed += len(failures)
                bar.update(len(chunk.items))
                bar.set_postfix(chunk=chunk.index, failed=failed, refresh=False)
                if stop.is_set():
                    stopped = True
                    log.warning(
                        "backfill %d stopped at a chunk boundary as asked; run it again to resume",
                        backfill.id,
                    )
                    break
                if max_chunks is not None and committed >= max_chunks:
                    paused = True
                    break
        if stopped:
            status = "stopped"
        else:
            status = "complete" if not paused and store.finish_backfill(backfill) else "paused"
    finally:
        bar.close()
        restore_sigterm()
    return BackfillReport(
        backfill_id=backfill.id,
        target_space=target.name,
        status=status,
        chunks_committed=committed,
        items_written=written,
        items_failed=failed,
        seconds=time.perf_counter() - started,
        failed=store.failed_items(),
    )


# ------------------------------------------------------------------ command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m modelupgrade.scale.ray_backfill",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--params", default="params.yaml", help="params file (store and dataset sections)"
    )
    parser.add_argument("--store", help="store directory (default: store.path)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="new model directory: re-embed every item's image")
    what.add_argument(
        "--transform-head", help="forward head: apply ψ to the stored vectors (no images)"
    )
    parser.add_argument(
        "--space", help="target space (default: the model directory's name; required with a head)"
    )
    parser.add_argument(
        "--upgrades-from", nargs="+", help="space(s) the new model upgrades (default: its card)"
    )
    parser.add_argument("--policy", help="ordering policy (default: store.policy)")
    parser.add_argument(
        "--chunk-size",
        type=int,
        help="items per chunk, the unit of work and commit (default: store.chunk_size)",
    )
    parser.add_argument("--seed", type=int, help="seed of the random policy (default: params seed)")
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="re-queue the items that failed in the last backfill",
    )
    parser.add_argument(
        "--address",
        help="Ray cluster to join ('auto', ray://host:10001); default: start a local one",
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="actors computing chunks (default: one per GPU, else one per CPU)",
    )
    parser.add_argument(
        "--gpus-per-worker",
        type=float,
        help="GPUs of each actor (default: 1 when the cluster has GPUs)",
    )
    parser.add_argument(
        "--cpus-per-worker", type=float, default=1.0, help="CPUs of each actor (default: 1)"
    )
    parser.add_argument(
        "--max-chunks", type=int, help="stop after committing this many chunks (resume later)"
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="show a progress bar",
    )
    return parser


def _target_space(args: argparse.Namespace, store: GalleryStore) -> SpaceSpec:
    from modelupgrade.store.models import space_for_model

    if args.model:
        return space_for_model(args.model, name=args.space, upgrades_from=args.upgrades_from)
    from modelupgrade.heads import read_head_card

    if not args.space:
        raise UserError(
            "--space is required with --transform-head",
            hint="name the new model version, e.g. gen1-bict",
        )
    card = read_head_card(args.transform_head)
    serving = store.snapshot().serving_space
    return SpaceSpec(
        args.space,
        int(card["out_dim"]),
        tuple(args.upgrades_from or ([serving] if serving else [])),
        backward_compatible=True,
        model_ref=str(args.transform_head),
    )


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    from modelupgrade.config import load_params
    from modelupgrade.runtime import setup_logging
    from modelupgrade.store import ManifestImageSource, build_policy

    args = build_parser().parse_args(argv)
    setup_logging()
    try:
        import ray
    except ImportError:
        raise UserError(
            "the Ray backfill needs the optional dependencies", hint="pip install '.[scale]'"
        ) from None
    params = load_params(args.params)
    store_params = params.store
    recipe: VectorRecipe = (
        ModelVectors(
            str(args.model), ManifestImageSource(params.dataset), store_params.embed_batch_size
        )
        if args.model
        else HeadVectors(str(args.transform_head))
    )
    with GalleryStore.open(args.store or Path(store_params.path)) as store:
        if args.retry_failed:
            store.retry_failed()
        target = _target_space(args, store)
        recipe.check()  # bad paths fail here, before a cluster is started or joined
        ray.init(**({"address": args.address} if args.address else {"include_dashboard": False}))
        try:
            report = run_ray_backfill(
                store,
                target,
                recipe,
                build_policy(
                    args.policy or store_params.policy,
                    params.seed if args.seed is None else args.seed,
                ),
                args.chunk_size or store_params.chunk_size,
                WorkerPool.for_cluster(args.workers, args.gpus_per_worker, args.cpus_per_worker),
                max_chunks=args.max_chunks,
                progress=args.progress,
            )
        finally:
            ray.shutdown()
    print(json.dumps(report.as_dict(), indent=2))


if __name__ == "__main__":
    main()
