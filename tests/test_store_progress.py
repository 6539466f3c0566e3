"""Backfill progress is recorded per chunk, not per item row (``schema.CURRENT_ITEMS_DDL``).

A chunk commit writes its chunk log row (and a row per failed item); every reader sees its items
done, in the target space, through the ``current_items`` view; a complete backfill writes that
state into the item rows, so at rest the rows are true; a store of the previous schema (every row
written per item) reads the same after its migration.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from modelupgrade.store import GalleryStore
from tests.store_helpers import NEW, OLD, build_gallery, psi_job

N_ITEMS = 300
CHUNK = 50


def _rows(store: GalleryStore, table: str) -> list[tuple]:
    return store.db.query(f"SELECT slot, space, state, committed_chunk FROM {table} ORDER BY slot")


def test_a_chunk_commit_writes_a_few_rows_whatever_its_size(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", N_ITEMS) as store:
        job = psi_job(store, chunk=CHUNK, seed=0)
        job.run(max_chunks=1)  # plans (a write per item) and commits the first chunk
        connection = store.db.connection
        real_commit = store.backfills.commit_chunks
        changes: list[int] = []

        def counted(*args: object, **kwargs: object) -> None:
            before = connection.total_changes
            real_commit(*args, **kwargs)  # type: ignore[arg-type]
            changes.append(connection.total_changes - before)

        store.backfills.commit_chunks = counted  # type: ignore[method-assign]
        job.run(max_chunks=2)
        # one group of one or two chunks: a chunk log row each and the commit counter
        assert changes and sum(changes) <= 2 + len(changes)


def test_every_reader_sees_committed_chunks_and_the_rows_hold_the_state_at_rest(
    tmp_path: Path,
) -> None:
    with build_gallery(tmp_path / "s", N_ITEMS) as store:
        job = psi_job(store, chunk=CHUNK, seed=0)
        job.run(max_chunks=2)
        done = {item["slot"] for item in store.backfills.item_states() if item["state"] == "done"}
        assert len(done) == 2 * CHUNK
        snapshot = store.snapshot()
        np.testing.assert_array_equal(
            np.isin(snapshot.slots, sorted(done)), snapshot.spaces == NEW.name
        )
        status = store.status()
        assert status.items_by_space == {OLD.name: N_ITEMS - 2 * CHUNK, NEW.name: 2 * CHUNK}
        assert status.backfill.done == 2 * CHUNK
        # the rows themselves still say pending: nothing rewrote them
        raw_states = {state for _, _, state, _ in _rows(store, "items")}
        assert raw_states == {"pending"}
        assert [c.index for c in store.backfills.next_chunks(store.backfills.active())] == [2]
        assert job.run().status == "complete"
        assert _rows(store, "items") == _rows(store, "current_items")
        assert {space for _, space, _, _ in _rows(store, "items")} == {NEW.name}


def test_a_store_of_schema_3_with_a_running_backfill_reads_the_same_after_migration(
    tmp_path: Path,
) -> None:
    with build_gallery(tmp_path / "s", N_ITEMS) as store:
        psi_job(store, chunk=CHUNK, seed=0).run(max_chunks=2)
        expected = _rows(store, "current_items")
    # what schema 3 wrote: each committed item's row rewritten, and no view
    with sqlite3.connect(tmp_path / "s" / "store.sqlite") as db:
        db.execute(
            "UPDATE items SET space = ?, state = 'done', committed_chunk = planned_chunk WHERE "
            "state = 'pending' AND planned_chunk IN (SELECT chunk FROM chunk_log)",
            (NEW.name,),
        )
        db.execute("DROP VIEW current_items")
        db.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    with GalleryStore.open(tmp_path / "s") as store:
        assert _rows(store, "current_items") == expected
        assert psi_job(store, chunk=CHUNK, seed=0).run().status == "complete"
        assert {space for _, space, _, _ in _rows(store, "items")} == {NEW.name}
