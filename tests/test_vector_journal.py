"""The embedded store's vector journal: what makes a chunk's rows durable before its commit.

A SIGKILL never loses what a process wrote to a file (the page cache keeps it), so the crash tests
cannot tell a durable row from one that only reached the cache. These tests take the rows that a
power cut would lose off the disk by hand and check that the journal brings them back.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from modelupgrade.store import GalleryStore, TableVectors
from modelupgrade.store.backends import embedded
from modelupgrade.store.vectors import JOURNAL_SUFFIX, VectorJournal
from tests.store_helpers import NEW, build_gallery, final_state, psi_job


def _journal(store: GalleryStore, space: str = NEW.name) -> Path:
    return store.path / "vectors" / f"{space}{JOURNAL_SUFFIX}"


def _lose_rows(store_path: Path, space: str, slots: np.ndarray, dim: int) -> None:
    """Zero the rows of ``slots`` on disk and their checksums: the writes a power cut loses."""
    rows = np.memmap(store_path / "vectors" / f"{space}.f32", dtype=np.float32, mode="r+")
    rows = rows.reshape(-1, dim)
    rows[slots] = 0.0
    rows.flush()
    sums = np.memmap(store_path / "vectors" / f"{space}.sum", dtype=np.uint64, mode="r+")
    sums[slots] = 0
    sums.flush()
    del rows, sums


def _crash_before_checkpoint(store: GalleryStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job commits its chunks but dies before it lets go of the store (no checkpoint)."""
    monkeypatch.setattr(store.vectors, "checkpoint", lambda: None)
    report = psi_job(store, chunk=16).run(max_chunks=3)
    assert report.chunks_committed == 3
    monkeypatch.undo()


def test_a_writer_that_takes_the_store_redoes_the_rows_a_power_cut_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with build_gallery(tmp_path / "reference", 120) as reference:
        psi_job(reference, chunk=16).run()
        expected = final_state(reference)
    store = build_gallery(tmp_path / "s", 120)
    _crash_before_checkpoint(store, monkeypatch)
    committed = np.array(
        [s["slot"] for s in store.backfills.item_states() if s["space"] == NEW.name]
    )
    assert len(committed) == 48
    assert _journal(store).stat().st_size > 0
    store.close()
    _lose_rows(tmp_path / "s", NEW.name, committed, NEW.dim)
    _rebooted(_journal(store))
    size = _journal(store).stat().st_size
    with GalleryStore.open(tmp_path / "s") as reader:
        # A reader redoes nothing and takes no lock: it reads the journal's rows over the lost ones.
        assert reader.verify_vectors(NEW.name) == 48
        np.testing.assert_array_equal(
            reader.read_vectors(NEW.name, committed), expected[1][committed]
        )
        assert _journal(reader).stat().st_size == size
        assert not any((tmp_path / "s" / name).exists() for name in ("writer.json", "commit.json"))
    with GalleryStore.open(tmp_path / "s") as reopened:
        psi_job(reopened, chunk=16).run()  # the writer redoes the journal before it writes
        assert _journal(reopened).stat().st_size == 0  # replayed, made durable, emptied
        states, vectors, chunks = final_state(reopened)
    assert states == expected[0] and chunks == expected[2]
    assert np.array_equal(vectors, expected[1])


def _rebooted(journal: Path) -> None:
    """What the power cut also did: the machine booted again after the journal was written."""
    import os

    booted = float(
        next(
            line.split()[1]
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    )
    os.utime(journal, (booted - 60, booted - 60))


def test_without_the_replay_the_lost_rows_stay_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control of the test above: the rows it zeroes are ones nothing else restores."""
    store = build_gallery(tmp_path / "s", 120)
    _crash_before_checkpoint(store, monkeypatch)
    store.close()
    slots = np.arange(120)
    _lose_rows(tmp_path / "s", NEW.name, slots, NEW.dim)
    monkeypatch.setattr(embedded.EmbeddedVectors, "recover", lambda self: 0)
    with GalleryStore.open(tmp_path / "s") as reopened:
        assert not reopened.read_vectors(NEW.name, slots).any()


def test_a_finished_job_checkpoints_and_leaves_an_empty_journal(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", 100) as store:
        psi_job(store).run()
        assert _journal(store).stat().st_size == 0
        assert store.verify_vectors(NEW.name) == 100


def test_a_journal_past_its_size_limit_is_checkpointed_at_the_next_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "JOURNAL_CHECKPOINT_BYTES", 1)
    sizes: list[int] = []
    with build_gallery(tmp_path / "s", 100) as store:
        sync = store.vectors.sync

        def watched(spec):  # type: ignore[no-untyped-def]
            sync(spec)
            sizes.append(_journal(store, spec.name).stat().st_size)

        monkeypatch.setattr(store.vectors, "sync", watched)
        psi_job(store).run()
        assert sizes and set(sizes) == {0}
        assert store.verify_vectors(NEW.name) == 100


def test_a_reader_that_opens_the_store_while_a_writer_holds_it_leaves_its_journal(
    tmp_path: Path,
) -> None:
    with build_gallery(tmp_path / "s", 64) as store:
        store.add_space(NEW)
        with store.writing("test writer"):
            store.write_vectors(NEW.name, np.arange(8), np.ones((8, NEW.dim), np.float32))
            size = _journal(store).stat().st_size
            assert size > 0
            with GalleryStore.open(tmp_path / "s") as reader:
                assert _journal(reader).stat().st_size == size
        assert _journal(store).stat().st_size == 0


def _record_bytes(rows: int, dim: int) -> int:
    # slot, vector, checksum and source content hash of each row
    return struct.calcsize("<4sIII") + rows * (24 + 4 * dim)


def test_replay_stops_at_a_torn_or_corrupt_record(tmp_path: Path) -> None:
    journal = VectorJournal(tmp_path / "space.journal")
    vectors = np.arange(24, dtype=np.float32).reshape(6, 4)
    for start in (0, 2, 4):
        slots = np.arange(start, start + 2)
        journal.append(
            slots, vectors[start : start + 2], slots.astype(np.uint64) + 1, slots.astype(np.uint64)
        )
    journal.sync()
    journal.close()
    whole = journal.path.read_bytes()
    assert len(whole) == 3 * _record_bytes(2, 4)

    journal.path.write_bytes(whole[: -_record_bytes(2, 4) // 2])  # the last record torn
    assert [r[0].tolist() for r in journal.records()] == [[0, 1], [2, 3]]

    corrupt = bytearray(whole)
    corrupt[_record_bytes(2, 4) + 40] ^= 0xFF  # a flipped byte in the second record's vectors
    journal.path.write_bytes(bytes(corrupt))
    assert [r[0].tolist() for r in journal.records()] == [[0, 1]]

    journal.path.write_bytes(whole)
    replayed = list(journal.records())
    assert np.array_equal(np.concatenate([r[1] for r in replayed]), vectors)
    assert np.concatenate([r[2] for r in replayed]).tolist() == [1, 2, 3, 4, 5, 6]


def test_a_journal_whose_space_was_discarded_is_dropped_not_replayed(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", 16) as store:
        orphan = _journal(store, "gone")
        VectorJournal(orphan).append(
            np.arange(2), np.ones((2, 3), np.float32), np.ones(2, np.uint64), np.ones(2, np.uint64)
        )
        assert orphan.stat().st_size > 0
        assert store.vectors.recover() == 0
        assert not orphan.exists()
        assert not (store.path / "vectors" / "gone.f32").exists()


def test_settled_counts_what_the_status_counts(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", 100) as store:
        ids = [f"item-{i:05d}" for i in range(100) if i % 7]
        table = TableVectors(ids, np.ones((len(ids), NEW.dim), np.float32))
        job = psi_job(store, chunk=16)
        job.executor.source = table
        job.executor.method = table.method
        job.run(max_chunks=4)
        status = store.status().backfill
        assert status is not None and status.failed > 0
        backfill = store.backfills.active()
        assert backfill is not None
        assert store.backfills.settled(backfill) == status.done + status.failed
