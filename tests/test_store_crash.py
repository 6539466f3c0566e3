"""Crash safety of the backfill: SIGKILL at random points, resume, compare with
an uninterrupted run.

The job runs in a subprocess that is killed several times; meanwhile a thread of this process keeps
querying the same store. The resumed store must equal the uninterrupted one vector for vector and
chunk for chunk, and every query must return k distinct items.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from modelupgrade.store import GalleryStore
from tests.store_helpers import (
    NEW,
    build_gallery,
    final_state,
    kill_after_a_commit,
    plan_psi_backfill,
    psi_job,
    psi_searchers,
    slow_backfill_script,
    spawn_backfill_worker,
    wait_for_chunks,
)

ROOT = Path(__file__).resolve().parents[1]
N_ITEMS = 3000
CHUNK = 64

WORKER = slow_backfill_script(CHUNK)


def _reference(tmp_path: Path) -> tuple[list, np.ndarray, list]:
    with build_gallery(tmp_path / "reference", N_ITEMS) as store:
        report = psi_job(store, chunk=CHUNK, seed=0).run()
        assert report.status == "complete"
        return final_state(store)


class _Querier(threading.Thread):
    """Queries the store in a loop while the backfill runs; records every anomaly."""

    def __init__(self, path: Path, k: int) -> None:
        super().__init__(daemon=True)
        self.path, self.k = path, k
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.queries = 0
        self.spaces_seen: set[str] = set()

    def run(self) -> None:
        rng = np.random.default_rng(1)
        with GalleryStore.open(self.path) as store:
            searchers = psi_searchers(store)
            while not self.stop.is_set():
                for searcher in searchers:
                    try:
                        hits = searcher.search(
                            rng.normal(size=(3, NEW.dim)).astype(np.float32), self.k
                        )
                    except Exception as err:  # noqa: BLE001 - any failure is what the test looks for
                        self.errors.append(repr(err))
                        continue
                    self.queries += 1
                    for row, spaces in zip(hits.item_ids, hits.spaces, strict=True):
                        if len(set(row)) != self.k:
                            self.errors.append(f"{len(set(row))} distinct items in a top-{self.k}")
                        self.spaces_seen.update(spaces)


def test_sigkill_at_random_points_then_resume_equals_uninterrupted_run(tmp_path: Path) -> None:
    expected_states, expected_vectors, expected_chunks = _reference(tmp_path)

    store_path = tmp_path / "crashed"
    with build_gallery(store_path, N_ITEMS) as store:
        # Planned up front so that the querier sees the new serving space from its first query.
        plan_psi_backfill(store, CHUNK)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    querier = _Querier(store_path, k=10)
    querier.start()
    rng = np.random.default_rng(2024)
    kills = 0
    progress = []
    with GalleryStore.open(store_path) as watcher:
        for _ in range(5):
            kills += kill_after_a_commit(watcher, script, 0.01, rng, wait=30, jitter=0.12)
            progress.append(len(watcher.backfills.chunk_log()))
    process = spawn_backfill_worker(store_path, script, delay=0.0)
    out, err = process.communicate(timeout=60)
    querier.stop.set()
    querier.join(timeout=30)

    assert process.returncode == 0, err
    assert out.split()[0] == "complete"
    assert kills >= 3, f"the job finished too fast to be killed (progress {progress})"
    assert 0 < progress[0] < progress[-1] < len(expected_chunks), progress
    assert querier.queries > 0 and not querier.errors, querier.errors[:5]
    assert querier.spaces_seen == {"gen0", "gen1"}

    with GalleryStore.open(store_path) as store:
        states, vectors, chunks = final_state(store)
    assert states == expected_states
    np.testing.assert_array_equal(vectors, expected_vectors)
    # Every chunk committed exactly once with the same items and bit-identical vectors.
    assert chunks == expected_chunks
    assert [c[0] for c in chunks] == list(range(len(chunks)))
    assert sum(c[1] for c in chunks) == N_ITEMS


def test_crash_between_vector_write_and_commit_redoes_the_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected_states, expected_vectors, expected_chunks = _reference(tmp_path)
    with build_gallery(tmp_path / "crashed", N_ITEMS) as store:
        job = psi_job(store, chunk=CHUNK, seed=0)
        assert job.run(max_chunks=3).status == "paused"
        real_commit = store.backfills.commit_chunks

        def crash(*args: object, **kwargs: object) -> None:
            raise OSError("simulated power loss after the vectors were written")

        monkeypatch.setattr(store.backfills, "commit_chunks", crash)
        with pytest.raises(OSError):
            job.run()
        monkeypatch.setattr(store.backfills, "commit_chunks", real_commit)
        assert len(store.backfills.chunk_log()) == 3
        assert store.status().backfill.done == 3 * CHUNK
        assert job.run().status == "complete"
        states, vectors, chunks = final_state(store)
    assert states == expected_states
    np.testing.assert_array_equal(vectors, expected_vectors)
    assert chunks == expected_chunks


def test_sigterm_stops_at_a_chunk_boundary_and_the_job_resumes(tmp_path: Path) -> None:
    store_path = tmp_path / "store"
    build_gallery(store_path, N_ITEMS).close()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    process = spawn_backfill_worker(store_path, script, delay=0.02)
    with GalleryStore.open(store_path) as watcher:
        wait_for_chunks(watcher, process, 2)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert out.split()[0] == "stopped"
    with GalleryStore.open(store_path) as store:
        status = store.status().backfill
        committed = len(store.backfills.chunk_log())
        assert 2 <= committed < N_ITEMS // CHUNK
        assert status.done == committed * CHUNK  # whole chunks only
        report = psi_job(store, chunk=CHUNK, seed=0).run()
        assert report.status == "complete"
        assert report.chunks_committed + committed == len(store.backfills.chunk_log())
