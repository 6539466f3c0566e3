"""The backfill job: moves every gallery item into the new embedding space, chunk by chunk.

A backfill is *planned* once (the policy's order, cut into fixed chunks, written in one transaction)
and then *executed* chunk by chunk. For each chunk the job computes the new vectors, writes them
into the items' slots of the target space and makes them durable, and only then commits one SQLite
transaction that flips the items' space and state and appends the chunk to the chunk log. So:

* an item is never marked done without its vector on disk;
* a crash before the commit leaves the chunk pending: the resumed job recomputes the same chunk
  (same items, same slots) and overwrites the unreferenced rows; nothing is lost;
* a committed chunk is never processed again (it has no pending item, and the chunk log's key
  forbids a second entry), so each item's final vector is written by exactly one committed chunk.

Commits run on a writer thread while the next chunks are computed. Chunks that finish while a commit
is in flight are committed together (one vector sync, one transaction: a group commit); commits
still happen one at a time in chunk order, so the guarantees above are unchanged.

Where chunks are computed is the job's *executor*: in this process, one chunk after another
(``LocalExecutor``), or on a pool of Ray workers (``modelupgrade.scale.ray_backfill``). Either way
this job alone plans, writes and commits, in plan order.

Before it changes anything the job checks what it can: the plan's rules (one source space the
target upgrades, no other backfill running), the target against a space of that name already held,
whether the serving mode the store is searched in meanwhile can serve the target next to the source
(``ServingCheck``), and a probe: its vector source computes a sample of the items to move, so a
model or head of the wrong dimensions, or images that cannot be read, stop it with nothing changed.
It holds the store's writer lock (``modelupgrade.store.lock``) from the first check to the last
commit.

A backfill is complete only when every item it planned is in the target space; a run that ends
with failed items reports ``incomplete`` (``EXIT_INCOMPLETE``) and the backfill stays running until
they are retried or it is aborted (``abort_backfill``). SIGTERM asks the job to stop after the
chunk in progress commits (``stopped``, ``EXIT_STOPPED``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
from tqdm.auto import tqdm

from modelupgrade.errors import EXIT_INCOMPLETE, EXIT_STOPPED, UserError
from modelupgrade.ordering.base import OrderingPolicy
from modelupgrade.serving.base import QUERY_FORMS, SERVING_MODES, Forms, Pairing, ServingMode
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.images import ImageSource
from modelupgrade.store.schema import Backfill, Chunk, ChunkCommit
from modelupgrade.store.spaces import SpaceSpec
from modelupgrade.store.status import StoreStatus

log = logging.getLogger(__name__)

EmbedFn = Callable[[np.ndarray], np.ndarray]
TransformFn = Callable[[np.ndarray], np.ndarray]

# Items a backfill computes, spread over the items to move, before it changes anything.
PROBE_ITEMS = 16


@dataclass
class ChunkVectors:
    slots: np.ndarray
    vectors: np.ndarray
    failures: dict[int, str] = field(default_factory=dict)

    def commit_of(self, chunk: Chunk) -> ChunkCommit:
        """What commits ``chunk`` once these vectors are durable: its slots, failures, digest."""
        return ChunkCommit(
            chunk, self.slots, self.failures, vectors_digest(self.slots, self.vectors)
        )


class VectorSource(Protocol):
    """Computes the target-space vectors of a chunk's items."""

    method: str

    def compute(self, store: GalleryStore, chunk: Chunk, target: SpaceSpec) -> ChunkVectors: ...


class ReEmbedImages:
    """Decode each item's image and run the new model on it."""

    method = "embed"

    def __init__(self, images: ImageSource, embed_fn: EmbedFn) -> None:
        self.images, self.embed_fn = images, embed_fn

    def compute(self, store: GalleryStore, chunk: Chunk, target: SpaceSpec) -> ChunkVectors:
        loaded = self.images.load(chunk.items)
        if len(loaded.slots) == 0:
            return ChunkVectors(
                loaded.slots, np.empty((0, target.dim), dtype=np.float32), loaded.failures
            )
        vectors = np.asarray(self.embed_fn(loaded.images))
        if vectors.ndim != 2 or len(vectors) != len(loaded.slots):
            raise UserError(
                f"the embedding function returned shape {vectors.shape} for "
                f"{len(loaded.slots)} images",
                hint="it must return one (D,) vector per image",
            )
        return _drop_non_finite(
            ChunkVectors(loaded.slots, vectors, loaded.failures), target, "the new model"
        )


class TransformStored:
    """Apply ψ to the items' stored vectors: the path for galleries whose images are gone (BiCT)."""

    method = "transform"

    def __init__(self, transform_fn: TransformFn) -> None:
        self.transform_fn = transform_fn

    def compute(self, store: GalleryStore, chunk: Chunk, target: SpaceSpec) -> ChunkVectors:
        spaces = {item.space for item in chunk.items}
        if len(spaces) != 1:
            raise RuntimeError(f"chunk {chunk.index} mixes items of spaces {sorted(spaces)}")
        slots = chunk.slots
        vectors = np.asarray(self.transform_fn(store.read_vectors(spaces.pop(), slots)))
        if vectors.ndim != 2 or len(vectors) != len(slots):
            raise UserError(
                f"the transformation returned shape {vectors.shape} for {len(slots)} vectors",
                hint="ψ must map each stored vector to one target-space vector",
            )
        return _drop_non_finite(ChunkVectors(slots, vectors), target, "the transformation")


class TableVectors:
    """Take each item's new vector from a table computed elsewhere (e.g. an offline batch job)."""

    method = "table"

    def __init__(self, item_ids: Sequence[str], vectors: np.ndarray) -> None:
        if len(item_ids) != len(vectors):
            raise UserError(f"{len(vectors)} vectors for {len(item_ids)} item ids")
        self.rows = {str(item_id): row for row, item_id in enumerate(item_ids)}
        if len(self.rows) != len(item_ids):
            raise UserError("the item ids of the vector table are not unique")
        self.vectors = np.asarray(vectors)

    def compute(self, store: GalleryStore, chunk: Chunk, target: SpaceSpec) -> ChunkVectors:
        found = [item for item in chunk.items if item.item_id in self.rows]
        failures = {
            item.slot: f"the vector table has no row for item {item.item_id}"
            for item in chunk.items
            if item.item_id not in self.rows
        }
        vectors = self.vectors[[self.rows[item.item_id] for item in found]].reshape(len(found), -1)
        slots = np.array([item.slot for item in found], dtype=np.int64)
        return _drop_non_finite(ChunkVectors(slots, vectors, failures), target, "the vector table")


def _drop_non_finite(result: ChunkVectors, target: SpaceSpec, producer: str) -> ChunkVectors:
    if result.vectors.shape[1] != target.dim:
        raise UserError(
            f"{producer} produces {result.vectors.shape[1]}-d vectors, but space {target.name!r} "
            f"holds {target.dim}-d vectors",
            hint="the model (or head) does not belong to this embedding space; "
            "check which one was given",
        )
    finite = np.isfinite(result.vectors).all(axis=1)
    failures = dict(result.failures)
    for slot in result.slots[~finite]:
        failures[int(slot)] = f"{producer} produced NaN or infinite values"
    return ChunkVectors(
        result.slots[finite], np.ascontiguousarray(result.vectors[finite], np.float32), failures
    )


def vectors_digest(slots: np.ndarray, vectors: np.ndarray) -> str:
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(slots, dtype=np.int64).tobytes())
    digest.update(np.ascontiguousarray(vectors, dtype=np.float32).tobytes())
    return digest.hexdigest()


@dataclass
class BackfillReport:
    backfill_id: int
    target_space: str
    # complete: every planned item is in the target space; incomplete: nothing is pending but
    # items failed; stopped: SIGTERM; paused: the run's max_chunks
    status: str
    chunks_committed: int
    items_written: int
    items_failed: int
    seconds: float
    failed: list[dict[str, str]] = field(default_factory=list)
    store: str = ""
    source_space: str = ""

    @property
    def items_per_second(self) -> float:
        return (self.items_written + self.items_failed) / self.seconds if self.seconds > 0 else 0.0

    @property
    def exit_code(self) -> int:
        return {"incomplete": EXIT_INCOMPLETE, "stopped": EXIT_STOPPED}.get(self.status, 0)

    @property
    def exit_message(self) -> str | None:
        """The error line of a run that did not finish the backfill."""
        where = f" --store {self.store}" if self.store else ""
        if self.status == "incomplete":
            return (
                f"{len(self.failed)} item(s) failed and are still served from space "
                f"{self.source_space!r}, so backfill {self.backfill_id} into "
                f"{self.target_space!r} is not complete; `modelupgrade store-status{where}` "
                "lists them (failed) with the reason of each\n  hint: fix their cause and run "
                "the backfill again with --retry-failed, or undo it with "
                f"`modelupgrade backfill{where} --abort`"
            )
        if self.status == "stopped":
            return (
                f"backfill {self.backfill_id} into {self.target_space!r} was stopped (SIGTERM) "
                f"at a chunk boundary after {self.chunks_committed} chunk(s) of this run\n  hint: "
                "run the same command again to resume it"
            )
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "items_per_second": self.items_per_second,
            "exit_code": self.exit_code,
        }

    def describe(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    @classmethod
    def whole_backfill(cls, status: StoreStatus, run_status: str) -> BackfillReport:
        """The totals of the store's last backfill, across every run that worked on it (a
        ``BackfillJob.run`` covers the chunks of one run only), as the store records them;
        ``run_status`` is how the latest run ended."""
        backfill = status.backfill
        if backfill is None:
            raise UserError(f"the store at {status.path} has not run a backfill")
        ended = backfill["finished_at"] or time.time()
        return cls(
            backfill_id=backfill["id"],
            target_space=backfill["target_space"],
            status=run_status,
            chunks_committed=backfill["chunks_committed"],
            items_written=backfill["done"],
            items_failed=backfill["failed"],
            seconds=ended - backfill["started_at"],
            failed=list(status.failed),
            store=status.path,
            source_space=backfill["source_space"],
        )


@dataclass(frozen=True)
class ServingCheck:
    """The serving mode the store is searched in while a backfill runs, and whether the service
    has a forward head ψ: a backfill into a space it cannot serve next to the source space is
    refused before it starts (otherwise every query fails until the backfill ends)."""

    mode: ServingMode
    forward_head: bool = False

    def problem(self, source: SpaceSpec, target: SpaceSpec) -> str | None:
        """Why ``mode`` cannot serve a store half in ``source``, half in ``target``; None if it can.

        Query forms come with each request or from the heads the service is started with, so
        every one is assumed available; the gallery forms are the store's: the stored vectors,
        the target's form, and ψ(stored) with a forward head. ``Searcher`` applies the same rules.
        """
        galleries = {"stored", target.form} | ({"forward"} if self.forward_head else set())
        plan = self.mode.try_plan(Forms.of(QUERY_FORMS, galleries))
        name = self.mode.registry_name
        if plan is None:
            return (
                f"serving mode {name!r} cannot search space {target.name!r}, which will hold "
                f"{target.form!r} vectors ({self.mode.description})"
            )
        if plan.old_part == Pairing("new", "stored") and not target.compares_with_stored(
            source.name
        ):
            return (
                f"model {target.name!r} is not backward compatible with the store's space "
                f"{source.name!r}, so serving mode {name!r} cannot compare its queries with the "
                "items not yet backfilled: every search would fail until the backfill ends"
            )
        return None

    def check(self, source: SpaceSpec, target: SpaceSpec) -> None:
        problem = self.problem(source, target)
        if problem is None:
            return
        working = [
            name
            for name in SERVING_MODES.names()
            if ServingCheck(SERVING_MODES.get(name)()).problem(source, target) is None
        ]
        with_head = (
            not self.forward_head
            and ServingCheck(self.mode, forward_head=True).problem(source, target) is None
        )
        ways = []
        if working:
            ways.append(
                f"serve with {' or '.join(working)} while it runs and say so with --mode "
                f"{working[0]}"
            )
        if with_head:
            ways.append(
                f"serve {self.mode.registry_name} with a forward head ψ {source.name} → "
                f"{target.name} and pass it with --forward-head"
            )
        raise UserError(
            f"{problem}; nothing was changed",
            hint="; or ".join(ways) or "backfill into a space the serving mode can search",
        )


def start_or_resume(
    store: GalleryStore,
    target: SpaceSpec,
    method: str,
    policy: OrderingPolicy,
    chunk_size: int,
    seed: int = 0,
    serving: ServingCheck | None = None,
    probe: Callable[[Chunk], None] | None = None,
) -> Backfill:
    """The running backfill into ``target`` (resumed as planned), or a newly planned one.

    The order is the shared policy's (``modelupgrade.ordering``) over the items to move, sorted by
    slot, reading the score the store holds for the policy's score kind: the order the simulator
    draws for a gallery in the same order, with the same seed.

    Nothing changes until every check passed: the plan's rules, the target against a space of its
    name, ``serving`` (a new plan only: a running backfill is finished or aborted, not refused),
    and ``probe``, called with a sample of the items to move (it raises to refuse).
    """
    with store.writing(f"backfill into {target.name!r}"):
        active = store.backfills.active()
        if active is not None:
            if active.target_space != target.name:
                raise UserError(
                    f"a backfill into space {active.target_space!r} is still running in "
                    f"{store.path}",
                    hint=f"resume it with the model of {active.target_space!r}, or abandon it "
                    "with `modelupgrade backfill --abort`, before starting another",
                )
            if active.method != method:
                raise UserError(
                    f"backfill {active.id} was started with method {active.method!r}; "
                    "resume it the same way",
                    hint="embed: re-embed images with the new model; transform: apply ψ to stored "
                    "vectors; table: take vectors from a table",
                )
            store.registered(target)
            pending = store.backfills.next_chunks(active, limit=1)
            if probe is not None and pending:
                items = pending[0].items
                probe(Chunk(0, -1, tuple(items[i] for i in _spread(len(items)))))
            log.info(
                "resuming backfill %d into %s (planned with %s, chunks of %d)",
                active.id,
                active.target_space,
                active.policy,
                active.chunk_size,
            )
            return active
        if chunk_size < 1:
            raise UserError(f"chunk_size must be ≥ 1, got {chunk_size}")
        source, to_move = store.backfills.check_plan(target)
        store.registered(target)
        if serving is not None:
            serving.check(store.space(source), target)
        scores = None if policy.score is None else store.scores(policy.score, to_move)
        order = to_move[policy.order(len(to_move), scores, seed)]
        if probe is not None:
            probe(Chunk(0, -1, tuple(store.items(order[_spread(len(order))]))))
        spec = store.add_space(target)
        return store.backfills.plan(spec, method, policy.registry_name, seed, order, chunk_size)


def _spread(count: int, most: int = PROBE_ITEMS) -> np.ndarray:
    """Up to ``most`` positions spread evenly over ``count`` (a probe outside any plan)."""
    return np.unique(np.linspace(0, count - 1, min(most, count)).astype(np.int64))


@dataclass
class BackfillPreview:
    """What a backfill would do and cost, measured before anything changes
    (``preview_backfill``)."""

    store: str
    source_space: str
    target_space: str
    method: str
    items_to_move: int
    resumes_backfill: int | None
    sampled_items: int
    sample_failures: int
    measured_seconds: float
    items_per_second: float
    estimated_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        hours, rest = divmod(self.estimated_seconds, 3600)
        what = (
            f"resume backfill {self.resumes_backfill}"
            if self.resumes_backfill is not None
            else "plan a new backfill"
        )
        return "\n".join(
            [
                (
                    f"dry run ({what}; nothing was written): {self.source_space} → "
                    f"{self.target_space} in {self.store}"
                ),
                f"  items to move:      {self.items_to_move}",
                f"  producer:           {self.method}, {self.items_per_second:,.1f} items/s on "
                f"this machine ({self.sampled_items} items sampled, {self.measured_seconds:.2f} s"
                + (f", {self.sample_failures} failed" if self.sample_failures else "")
                + ")",
                (
                    f"  estimated wall time: {int(hours)} h {rest / 60:.1f} min (the producer's "
                    "time; each commit adds a sync)"
                ),
            ]
        )


# Items a dry run times, and how long it keeps timing them (a cheap ψ needs repeats to measure).
PREVIEW_ITEMS = 128
_PREVIEW_SECONDS = 0.5
_PREVIEW_REPEATS = 50


def preview_backfill(
    store: GalleryStore,
    target: SpaceSpec,
    source: VectorSource,
    serving: ServingCheck | None = None,
    sample: int = PREVIEW_ITEMS,
) -> BackfillPreview:
    """Items to move, the measured items/s of ``source`` on a sample of them, and the estimated
    wall time of a backfill into ``target``; the checks a backfill makes before it changes anything
    run too. Nothing is written: no writer lock, no space, no plan, no vector."""
    active = store.backfills.active()
    if active is not None:
        if active.target_space != target.name:
            raise UserError(
                f"a backfill into space {active.target_space!r} is still running in {store.path}",
                hint="preview the backfill that would resume it, or abort it first",
            )
        pending = int((store.status().backfill or {}).get("pending", 0))
        chunks = store.backfills.next_chunks(active, limit=max(1, -(-sample // active.chunk_size)))
        candidates = [item for chunk in chunks for item in chunk.items]
        picked = [candidates[i] for i in _spread(len(candidates), sample)] if candidates else []
        source_space, count = active.source_space, pending
    else:
        source_space, to_move = store.backfills.check_plan(target)
        store.registered(target)
        if serving is not None:
            serving.check(store.space(source_space), target)
        picked = store.items(to_move[_spread(len(to_move), sample)])
        count = len(to_move)
    seconds, computed, failures = 0.0, 0, 0
    if picked:
        probe = Chunk(0, -1, tuple(picked))
        # Untimed first pass: one-time costs (weights onto the device, lazy imports) are no rate.
        source.compute(store, Chunk(0, -1, probe.items[:PROBE_ITEMS]), target)
        repeats = 0
        while repeats < _PREVIEW_REPEATS and (repeats == 0 or seconds < _PREVIEW_SECONDS):
            started = time.perf_counter()
            result = source.compute(store, probe, target)
            seconds += time.perf_counter() - started
            repeats += 1
        computed, failures = len(picked) * repeats, len(result.failures)
    rate = computed / seconds if seconds > 0 else 0.0
    return BackfillPreview(
        store=str(store.path),
        source_space=source_space,
        target_space=target.name,
        method=source.method,
        items_to_move=count,
        resumes_backfill=None if active is None else active.id,
        sampled_items=len(picked),
        sample_failures=failures,
        measured_seconds=seconds,
        items_per_second=rate,
        estimated_seconds=count / rate if rate > 0 else 0.0,
    )


def abort_backfill(store: GalleryStore) -> dict[str, Any]:
    """Undo the store's running backfill (``BackfillLedger.abort``) under the writer lock, and
    delete its target space's vectors when the space is dropped with it."""
    with store.writing("abort the backfill"):
        # Refused while the target's vectors cannot be deleted (Milvus out of reach), rather than
        # recorded as aborted with its vectors left behind an error.
        store.vectors.reachable()
        undone = store.backfills.abort()
        if undone["target_space_dropped"]:
            store.discard_vectors(undone["target_space"])
    log.info(
        "backfill %d into %s aborted: %d item(s) back in %s, serving %s",
        undone["backfill_id"],
        undone["target_space"],
        undone["items"],
        undone["source_space"],
        undone["serving_space"],
    )
    return undone


@runtime_checkable
class ChunkExecutor(Protocol):
    """Computes the pending chunks of a backfill and hands them back in plan order."""

    method: str

    def computed(
        self, store: GalleryStore, backfill: Backfill, target: SpaceSpec
    ) -> Iterator[tuple[Chunk, ChunkVectors]]: ...


class LocalExecutor:
    """One chunk after another in this process, reading the plan a few chunks ahead."""

    def __init__(self, source: VectorSource, read_ahead: int = 32) -> None:
        self.source, self.read_ahead = source, read_ahead
        self.method = source.method

    def computed(
        self, store: GalleryStore, backfill: Backfill, target: SpaceSpec
    ) -> Iterator[tuple[Chunk, ChunkVectors]]:
        upcoming = deque(store.backfills.next_chunks(backfill, limit=self.read_ahead))
        while upcoming:
            chunk = upcoming.popleft()
            result = self.source.compute(store, chunk, target)
            if not upcoming:
                # Chunks computed but not yet committed are still pending: read past this one.
                upcoming.extend(
                    store.backfills.next_chunks(backfill, after=chunk.index, limit=self.read_ahead)
                )
            yield chunk, result


class BackfillJob:
    """Runs (or resumes) the store's backfill into ``target`` with ``source``'s vectors.

    ``source`` is a ``VectorSource`` (computed here, chunk by chunk) or a ``ChunkExecutor``.
    """

    def __init__(
        self,
        store: GalleryStore,
        target: SpaceSpec,
        source: VectorSource | ChunkExecutor,
        policy: OrderingPolicy,
        chunk_size: int,
        seed: int = 0,
        progress: bool = True,
        max_group: int = 32,
        serving: ServingCheck | None = None,
    ) -> None:
        if max_group < 1:
            raise UserError(f"max_group must be at least 1, got {max_group}")
        self.store, self.target = store, target
        self.executor = (
            source if isinstance(source, ChunkExecutor) else LocalExecutor(source, max_group)
        )
        self.policy, self.chunk_size, self.seed, self.progress = policy, chunk_size, seed, progress
        self.max_group = max_group
        self.serving = serving
        self._stop = threading.Event()

    def request_stop(self) -> None:
        """Stop after the chunk in progress commits (what SIGTERM does)."""
        self._stop.set()

    def probe(self, sample: Chunk) -> None:
        """Compute ``sample``'s vectors without writing them: a source that fails on them, or
        reads none of them, is refused before the backfill changes anything. A local source only:
        an executor's workers are checked by whoever builds them (the command reads the cards)."""
        if not isinstance(self.executor, LocalExecutor):
            return
        try:
            result = self.executor.source.compute(self.store, sample, self.target)
        except UserError as err:
            raise UserError(f"{err.message}; nothing was changed", hint=err.hint) from None
        # Whatever the source raises on the probe (a head's shape error, say) refuses the backfill.
        except Exception as err:
            raise UserError(
                f"the backfill's vector source ({self.executor.method}) fails on "
                f"{len(sample.items)} of the items to move: {type(err).__name__}: {err}; nothing "
                "was changed",
                hint="check that the model or head takes the store's vectors "
                f"({', '.join(sorted({i.space for i in sample.items}))}) and gives "
                f"{self.target.dim}-d ones",
            ) from err
        if len(result.slots) == 0 and result.failures:
            raise UserError(
                f"none of {len(sample.items)} items sampled across the ones to move could be "
                f"computed, e.g. {next(iter(result.failures.values()))}; nothing was changed",
                hint="check where the images are (dataset.root in params.yaml, the items' paths) "
                "or that the vector table names the store's items",
            )

    def run(self, max_chunks: int | None = None) -> BackfillReport:
        """Run (or resume) the backfill, holding the store's writer lock throughout."""
        with self.store.writing(f"backfill into {self.target.name!r}"):
            return self._run(max_chunks)

    def _run(self, max_chunks: int | None) -> BackfillReport:
        backfill = start_or_resume(
            self.store,
            self.target,
            self.executor.method,
            self.policy,
            self.chunk_size,
            self.seed,
            self.serving,
            self.probe,
        )
        restore = self._install_sigterm()
        started = time.perf_counter()
        tally = {"chunks": 0, "written": 0, "failed": 0}
        bar = tqdm(
            total=backfill.total,
            initial=self.store.backfills.settled(backfill),
            unit="item",
            desc=f"backfill → {self.target.name}",
            disable=not self.progress,
            dynamic_ncols=True,
        )

        def commit(group: list[tuple[Chunk, ChunkVectors]]) -> None:
            for _, result in group:
                self.store.write_vectors(
                    self.target.name, result.slots, result.vectors, durable=False
                )
            # the rows are on disk before anything points at them
            self.store.sync_vectors(self.target.name)
            self.store.backfills.commit_chunks(
                self.target.name,
                [result.commit_of(chunk) for chunk, result in group],
            )
            for chunk, result in group:
                names = {item.slot: item.item_id for item in chunk.items}
                for slot, reason in result.failures.items():
                    log.warning("item %s skipped: %s", names[slot], reason)
                tally["chunks"] += 1
                tally["written"] += len(result.slots)
                tally["failed"] += len(result.failures)
                bar.update(len(chunk.items))
                bar.set_postfix(chunk=chunk.index, failed=tally["failed"], refresh=False)

        # A writer thread commits while the executor computes. Chunks computed while a commit is in
        # flight wait and go together in the next one (group commit: one vector sync, one
        # transaction), so a ψ cheaper than a sync does not wait for a sync per chunk. Groups are
        # runs of consecutive chunks committed in order, at most `max_group` chunks are ever
        # computed but uncommitted, and a crash loses only those.
        committing: Future[None] | None = None
        waiting: list[tuple[Chunk, ChunkVectors]] = []
        computed = 0
        try:
            if max_chunks is None or max_chunks > 0:
                with ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="backfill-commit"
                ) as writer:
                    for chunk, result in self.executor.computed(self.store, backfill, self.target):
                        computed += 1
                        waiting.append((chunk, result))
                        if (
                            committing is None
                            or committing.done()
                            or len(waiting) >= self.max_group
                        ):
                            if committing is not None:
                                # the previous group's error, if any, stops the job here
                                committing.result()
                            committing, waiting = writer.submit(commit, waiting), []
                        if self._stop.is_set() or (
                            max_chunks is not None and computed >= max_chunks
                        ):
                            break
                    if committing is not None:
                        committing.result()
                    if waiting:
                        writer.submit(commit, waiting).result()
            pending, failed = self.store.backfills.finish(backfill)
            if not pending:
                status = "incomplete" if failed else "complete"
            elif self._stop.is_set():
                status = "stopped"
                log.warning(
                    "stop requested: backfill %d stopped at a chunk boundary; "
                    "run it again to resume",
                    backfill.id,
                )
            else:
                status = "paused"
        finally:
            bar.close()
            restore()
        report = BackfillReport(
            backfill_id=backfill.id,
            target_space=self.target.name,
            status=status,
            chunks_committed=tally["chunks"],
            items_written=tally["written"],
            items_failed=tally["failed"],
            seconds=time.perf_counter() - started,
            failed=self.store.backfills.failed_items(),
            store=str(self.store.path),
            source_space=backfill.source_space,
        )
        if status == "incomplete":
            shown = report.failed[:5]
            log.warning(
                "backfill %d: %d item(s) failed, still served from %s: %s%s",
                backfill.id,
                len(report.failed),
                backfill.source_space,
                ", ".join(f"{f['item_id']} ({f['reason']})" for f in shown),
                f" and {len(report.failed) - len(shown)} more" if len(report.failed) > 5 else "",
            )
        return report

    def _install_sigterm(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = signal.getsignal(signal.SIGTERM)

        def handler(signum: int, frame: object) -> None:
            self._stop.set()

        signal.signal(signal.SIGTERM, handler)

        def restore() -> None:
            signal.signal(signal.SIGTERM, previous)

        return restore
