r"""The gallery store's backfill with its chunks computed on Ray Data: an executor
of ``BackfillJob``.

    modelupgrade backfill --executor ray --model models/extended-data/gen1-bct
    modelupgrade backfill --executor ray --ray-address auto \
        --transform-head heads/gen1/bict --space gen1-bict

(``pip install .[scale]``.) The job is the store's own (``modelupgrade.store.job.BackfillJob``): the
plan, the group commits, the resume and SIGTERM handling are the same; only where chunks are
computed differs. ``RayExecutor`` streams the pending chunks, one block each, through a pool of
actors that load the new model or ψ once (one GPU each when the cluster has GPUs, CPUs otherwise)
and compute a chunk's vectors with the single-process job's own ``VectorSource``: decode the images
and embed them in batches (``embed``), or read the stored vectors and apply ψ in batches
(``transform``). Results come back in plan order and this process alone writes and commits them, so
each item's vector is the one the single-process job writes.

The workers open the store and the images at the paths this process uses: on a cluster, both go on
a filesystem that every node mounts at the same path.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.images import ImageSource
from modelupgrade.store.schema import Backfill, Chunk
from modelupgrade.store.sources import (
    ChangedSources,
    ChunkVectors,
    ReEmbedImages,
    TransformStored,
    VectorSource,
)
from modelupgrade.store.spaces import SpaceSpec

log = logging.getLogger(__name__)


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
    changed_sources: ChangedSources = "refuse"
    method: ClassVar[str] = "embed"

    def check(self) -> None:
        from modelupgrade.models import read_model_card

        read_model_card(self.model_dir)

    def build(self, device: str) -> VectorSource:
        from modelupgrade.store.models import model_embed_fn

        return ReEmbedImages(
            self.images,
            model_embed_fn(self.model_dir, self.batch_size, device),
            self.changed_sources,
        )


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


def _chunk(store: GalleryStore, backfill_id: int, index: int, slots: np.ndarray) -> Chunk:
    """The chunk as the plan holds it: its items in plan order."""
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
                "content": b"",
                "failures": "{}",
                "user_error": json.dumps({"message": err.message, "hint": err.hint}),
            }
        return {
            "chunk": chunk.index,
            "slots": np.ascontiguousarray(result.slots, dtype=np.int64).tobytes(),
            "vectors": np.ascontiguousarray(result.vectors, dtype=np.float32).tobytes(),
            # the source content hashes (none for ψ): recorded beside each vector
            "content": b""
            if result.content is None
            else np.ascontiguousarray(result.content, dtype=np.uint64).tobytes(),
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
                hint="--gpus-per-worker 0 computes on CPUs; --ray-address joins a GPU cluster",
            )
        if workers is None:
            workers = max(
                1, int(gpus / gpus_per_worker if gpus_per_worker else cpus / cpus_per_worker)
            )
        if workers < 1:
            raise UserError(f"the backfill needs at least one worker, got {workers}")
        return cls(workers, gpus_per_worker, cpus_per_worker)


class RayExecutor:
    """Computes a backfill's pending chunks on a pool of Ray actors, handing
    them back in plan order."""

    def __init__(self, recipe: VectorRecipe, pool: WorkerPool | None = None) -> None:
        recipe.check()  # bad paths fail here, before a cluster is started or joined
        self.recipe, self.pool = recipe, pool
        self.method = recipe.method

    def computed(
        self, store: GalleryStore, backfill: Backfill, target: SpaceSpec
    ) -> Iterator[tuple[Chunk, ChunkVectors]]:
        import ray

        chunks = store.backfills.next_chunks(backfill, limit=None)
        if not chunks:
            return
        pool = self.pool or WorkerPool.for_cluster()
        log.info(
            "backfill %d: %d pending chunk(s) on %d Ray worker(s) (%s)",
            backfill.id,
            len(chunks),
            min(pool.workers, len(chunks)),
            pool.device,
        )
        # Results in plan order: the store then always serves a prefix of the plan, as the
        # single-process job and the simulator assume.
        ray.data.DataContext.get_current().execution_options.preserve_order = True
        rows = [{"chunk": chunk.index, "slots": chunk.slots.tobytes()} for chunk in chunks]
        computed = ray.data.from_items(rows, override_num_blocks=len(rows)).map(
            # A callable class, run in an actor pool; Ray's annotation names functions only.
            ChunkWorker,  # type: ignore[arg-type]
            fn_constructor_kwargs={
                "store_path": str(store.path),
                "backfill_id": backfill.id,
                "target": target,
                "recipe": self.recipe,
                "device": pool.device,
            },
            compute=ray.data.ActorPoolStrategy(size=min(pool.workers, len(rows))),
            num_cpus=pool.cpus_per_worker,
            num_gpus=pool.gpus_per_worker,
        )
        by_index = {chunk.index: chunk for chunk in chunks}
        for row in computed.iter_rows():
            if row["user_error"]:
                raise UserError(**json.loads(row["user_error"]))
            slots = np.frombuffer(row["slots"], dtype=np.int64)
            vectors = np.frombuffer(row["vectors"], dtype=np.float32).reshape(
                len(slots), target.dim
            )
            failures = {int(slot): reason for slot, reason in json.loads(row["failures"]).items()}
            content = np.frombuffer(row["content"], dtype=np.uint64) if row["content"] else None
            yield by_index[int(row["chunk"])], ChunkVectors(slots, vectors, failures, content)
