"""A backfill's cost and ETA, measured before anything changes (``backfill --dry-run``)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject, json_record
from modelupgrade.ordering.base import OrderingPolicy
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.job import PROBE_ITEMS, backfill_order, spread
from modelupgrade.store.schema import Chunk
from modelupgrade.store.serving_check import ServingCheck
from modelupgrade.store.sources import VectorSource
from modelupgrade.store.spaces import SpaceSpec


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

    def as_dict(self) -> JsonObject:
        return json_record(self)

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
    order: tuple[OrderingPolicy, int] | None = None,
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
        state = store.status().backfill
        pending = 0 if state is None else state.pending
        chunks = store.backfills.next_chunks(active, limit=max(1, -(-sample // active.chunk_size)))
        candidates = [item for chunk in chunks for item in chunk.items]
        picked = [candidates[i] for i in spread(len(candidates), sample)] if candidates else []
        source_space, count = active.source_space, pending
    else:
        source_space, to_move = store.backfills.check_plan(target)
        store.registered(target)
        if serving is not None:
            serving.check(store.space(source_space), target)
        if order is not None:
            policy, seed = order
            backfill_order(store, policy, to_move, seed)  # its checks: the scores it orders by
        picked = store.items(to_move[spread(len(to_move), sample)])
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
