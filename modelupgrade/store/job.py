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

The job holds the store's writer lease for its run (one backfill at a time) and its commit lock for
each group commit only, so items are ingested, updated and erased between its commits
(``modelupgrade.store.live``). A group commit writes only the items still planned in its chunks as
it finds them under the lock: an item erased or updated since its vector was computed is left out
(an updated one was queued again, with its new content). Items queued while the job runs (a live
ingest) are new chunks after the last one, which the job reads when it gets there.

Where chunks are computed is the job's *executor*: in this process, one chunk after another
(``LocalExecutor``), or on a pool of Ray workers (``modelupgrade.scale.ray_backfill``). Either way
this job alone plans, writes and commits, in plan order.

Before it changes anything the job checks what it can: the plan's rules (one source space the
target upgrades, no other backfill running), the target against a space of that name already held,
whether the serving mode the store is searched in meanwhile can serve the target next to the source
(``ServingCheck``), and a probe: its vector source computes a sample of the items to move, so a
model or head of the wrong dimensions, or images that cannot be read, stop it with nothing changed.
Re-running a backfill that has completed finds nothing to move and reports it complete (exit 0),
so a supervisor that retries the command after a kill just after the last commit sees success.

A backfill is complete only when every item it planned is in the target space; a run that ends
with failed items reports ``incomplete`` (``EXIT_INCOMPLETE``) and the backfill stays running until
they are retried or it is aborted (``abort_backfill``). SIGTERM asks the job to stop after the
chunk in progress commits (``stopped``, ``EXIT_STOPPED``).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

import numpy as np
from tqdm.auto import tqdm

from modelupgrade.errors import UserError
from modelupgrade.ordering.base import OrderingPolicy
from modelupgrade.store.faults import boundary
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.intents import complete_intents
from modelupgrade.store.ledger import AbortRecord
from modelupgrade.store.report import BackfillReport
from modelupgrade.store.schema import Backfill, Chunk
from modelupgrade.store.serving_check import ServingCheck
from modelupgrade.store.sources import ChunkVectors, VectorSource
from modelupgrade.store.spaces import SpaceSpec

log = logging.getLogger(__name__)

# Items a backfill computes, spread over the items to move, before it changes anything.
PROBE_ITEMS = 16


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
    """The running backfill into ``target`` (resumed as planned), a newly planned one, or, when
    every item is in ``target`` through the store's last backfill, that complete backfill (a re-run
    of a finished command has nothing left to do).

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
            return _resumed(store, active, target, method, probe)
        if chunk_size < 1:
            raise UserError(f"chunk_size must be ≥ 1, got {chunk_size}")
        done = store.backfills.completed_into(target.name)
        if done is not None:
            log.info("backfill %d into %s is complete: nothing to do", done.id, target.name)
            return done
        source, to_move = store.backfills.check_plan(target)
        store.registered(target)
        if serving is not None:
            serving.check(store.space(source), target)
        order = backfill_order(store, policy, to_move, seed)
        if probe is not None:
            probe(Chunk(0, -1, tuple(store.items(order[spread(len(order))]))))
        with store.committing(f"plan the backfill into {target.name!r}"):
            spec = store.add_space(target)
            planned = store.backfills.plan(
                spec, method, policy.registry_name, seed, order, chunk_size
            )
        boundary("backfill:planned")
        return planned


def backfill_order(
    store: GalleryStore, policy: OrderingPolicy, to_move: np.ndarray, seed: int
) -> np.ndarray:
    """The slots ``to_move`` in the order a new backfill moves them: ``policy`` over the store's
    scores of its kind (a kind the store was not ingested with is refused)."""
    scores = None if policy.score is None else store.scores(policy.score, to_move)
    return to_move[policy.order(len(to_move), scores, seed)]


def _resumed(
    store: GalleryStore,
    active: Backfill,
    target: SpaceSpec,
    method: str,
    probe: Callable[[Chunk], None] | None,
) -> Backfill:
    if active.target_space != target.name:
        raise UserError(
            f"a backfill into space {active.target_space!r} is still running in {store.path}",
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
        probe(Chunk(0, -1, tuple(items[i] for i in spread(len(items)))))
    log.info(
        "resuming backfill %d into %s (planned with %s, chunks of %d)",
        active.id,
        active.target_space,
        active.policy,
        active.chunk_size,
    )
    return active


def spread(count: int, most: int = PROBE_ITEMS) -> np.ndarray:
    """Up to ``most`` positions spread evenly over ``count`` (a probe outside any plan)."""
    return np.unique(np.linspace(0, count - 1, min(most, count)).astype(np.int64))


def abort_backfill(store: GalleryStore) -> AbortRecord:
    """Undo the store's running backfill (``BackfillLedger.abort``) under the writer lock, and
    delete its target space's vectors when the space is dropped with it."""
    with store.writing("abort the backfill"):
        # Refused while the target's vectors cannot be deleted (Milvus out of reach), rather than
        # recorded as aborted with its vectors left behind an error.
        store.vectors.reachable()
        with store.committing("abort the backfill"):
            undone = store.backfills.abort()
            boundary("abort:ledger")
            # the dropped target's vectors go (``intents``: recorded with the abort)
            complete_intents(store.db, store.vectors, store.spaces())
    log.info(
        "backfill %d into %s aborted: %d item(s) back in %s, serving %s",
        undone.backfill_id,
        undone.target_space,
        undone.items,
        undone.source_space,
        undone.serving_space,
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


class _Tally:
    """What one run computed and committed so far."""

    def __init__(self) -> None:
        self.computed = self.chunks = self.written = self.failed = 0


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
        """Run (or resume) the backfill, holding the store's writer lease throughout and its
        commit lock for each group commit."""
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
        started = time.perf_counter()
        if backfill.status == "complete":
            return self._report(backfill, "complete", _Tally(), started, already=True)
        restore = self._install_sigterm()
        tally = _Tally()
        bar = tqdm(
            total=backfill.total,
            initial=self.store.backfills.settled(backfill),
            unit="item",
            desc=f"backfill → {self.target.name}",
            disable=not self.progress,
            dynamic_ncols=True,
        )
        try:
            while self._run_chunks(backfill, max_chunks, tally, bar):
                pass  # items queued meanwhile (a live ingest) made new chunks: run them too
            pending, failed = self.store.backfills.finish(backfill)
            boundary("backfill:finished")
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
        return self._report(backfill, status, tally, started)

    def _run_chunks(
        self, backfill: Backfill, max_chunks: int | None, tally: _Tally, bar: Any
    ) -> bool:
        """Compute and commit the pending chunks; whether to look for more (chunks were committed,
        the run may go on, and more may have been queued since the executor last read the plan).

        A writer thread commits while the executor computes. Chunks computed while a commit is in
        flight wait and go together in the next one (group commit: one vector sync, one
        transaction), so a ψ cheaper than a sync does not wait for a sync per chunk. Groups are
        runs of consecutive chunks committed in order, at most ``max_group`` chunks are ever
        computed but uncommitted, and a crash loses only those."""
        if max_chunks is not None and tally.computed >= max_chunks:
            return False
        before = tally.computed
        committing: Future[None] | None = None
        waiting: list[tuple[Chunk, ChunkVectors]] = []

        def commit(group: list[tuple[Chunk, ChunkVectors]]) -> None:
            for chunk, kept in self._commit_group(backfill, group):
                for slot, reason in kept.failures.items():
                    names = {item.slot: item.item_id for item in chunk.items}
                    log.warning("item %s skipped: %s", names[slot], reason)
                tally.chunks += 1
                tally.written += len(kept.slots)
                tally.failed += len(kept.failures)
                bar.update(len(chunk.items))
                bar.set_postfix(chunk=chunk.index, failed=tally.failed, refresh=False)

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="backfill-commit") as writer:
            for chunk, result in self.executor.computed(self.store, backfill, self.target):
                tally.computed += 1
                waiting.append((chunk, result))
                if committing is None or committing.done() or len(waiting) >= self.max_group:
                    if committing is not None:
                        committing.result()  # the previous group's error, if any, stops the job
                    committing, waiting = writer.submit(commit, waiting), []
                if self._stop.is_set() or (max_chunks is not None and tally.computed >= max_chunks):
                    break
            if committing is not None:
                committing.result()
            if waiting:
                writer.submit(commit, waiting).result()
        ran_out = not self._stop.is_set() and (max_chunks is None or tally.computed < max_chunks)
        return ran_out and tally.computed > before

    def _commit_group(
        self, backfill: Backfill, group: list[tuple[Chunk, ChunkVectors]]
    ) -> list[tuple[Chunk, ChunkVectors]]:
        """Write and commit ``group`` under the commit lock: each chunk's items as the ledger
        holds them now (``BackfillLedger.still_planned``), their vectors stored and made durable
        before one transaction commits them all. Returns what was committed, chunk by chunk."""
        with self.store.committing(f"backfill into {self.target.name!r}"):
            kept = []
            for chunk, result in group:
                members = self.store.backfills.still_planned(chunk)
                chunk = Chunk(
                    chunk.backfill_id,
                    chunk.index,
                    tuple(item for item in chunk.items if item.slot in members),
                )
                kept.append((chunk, result.restricted_to(members)))
            for chunk, result in kept:
                ids = {item.slot: item.item_id for item in chunk.items}
                self.store.write_vectors(
                    self.target.name,
                    result.slots,
                    result.vectors,
                    durable=False,
                    content=result.content,
                    written_by=(backfill.id, chunk.index),
                    item_ids=[ids[int(slot)] for slot in result.slots],
                )
            # the rows are on disk before anything points at them
            self.store.sync_vectors(self.target.name)
            source = self.store.space(backfill.source_space)
            for chunk, result in kept:
                # a vector database's rows of the source record the move (``snapshots``)
                self.store.vectors.mark_moved(source, result.slots, (backfill.id, chunk.index))
            boundary("backfill:vectors")
            self.store.backfills.commit_chunks(
                self.target.name,
                [result.commit_of(chunk) for chunk, result in kept if chunk.items],
            )
            boundary("backfill:committed")
        return kept

    def _report(
        self,
        backfill: Backfill,
        status: str,
        tally: _Tally,
        started: float,
        already: bool = False,
    ) -> BackfillReport:
        failed = self.store.backfills.failed_items()
        report = BackfillReport(
            backfill_id=backfill.id,
            target_space=self.target.name,
            status=status,
            chunks_committed=tally.chunks,
            items_written=tally.written,
            items_failed=tally.failed,
            seconds=time.perf_counter() - started,
            failed=failed,
            store=str(self.store.path),
            source_space=backfill.source_space,
            already_complete=already,
        )
        if status == "incomplete":
            shown = failed[:5]
            log.warning(
                "backfill %d: %d item(s) failed, still served from %s: %s%s",
                backfill.id,
                len(failed),
                backfill.source_space,
                ", ".join(f"{f.item_id} ({f.reason})" for f in shown),
                f" and {len(failed) - len(shown)} more" if len(failed) > 5 else "",
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
