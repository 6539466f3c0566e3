"""One conformance suite for every vector backend of the gallery store: embedded and Milvus Lite.

Each test taking the ``backend`` fixture runs against each backend, in a fresh store under
``tmp_path`` (Milvus Lite: its default file inside the store): ingest with provenance, the refusals,
a backfill SIGKILLed at random points then resumed (equal, vector for vector, to an uninterrupted
run), serving while a backfill writes, and the store commands. The others hold the two backends to
the same answers in every serving mode (with vectors written but not yet committed), check the one
error of a Milvus Lite file held by another process, and the ``store`` section of params.yaml.

Milvus Lite serves one process at a time (it locks its file), so while a backfill process runs, the
queries of the serving test run in the backfilling process; between kills, this process queries.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from modelupgrade.errors import UserError
from modelupgrade.ordering import build_ordering
from modelupgrade.serving import build_serving_mode
from modelupgrade.store import (
    BackendSettings,
    BackfillJob,
    GalleryStore,
    HeadTransforms,
    QueryVectors,
    Searcher,
    SpaceSpec,
    TransformStored,
)
from modelupgrade.store.backends.base import VectorRows
from modelupgrade.store.backends.milvus import MilvusVectors
from modelupgrade.store.steps import StepDetail
from modelupgrade.store.vectors import vector_checksums
from tests.store_helpers import (
    NEW,
    OLD,
    PROJECT_PARAMS,
    build_gallery,
    final_state,
    kill_after_a_commit,
    plan_psi_backfill,
    psi,
    psi_job,
    psi_searchers,
    python_child,
    reverse,
    slow_backfill_script,
    spawn_backfill_worker,
)

pytest.importorskip("pymilvus")

ROOT = Path(__file__).resolve().parents[1]
N_ITEMS = 1200
CHUNK = 48
K = 10

WORKER = slow_backfill_script(CHUNK, job_options="max_group=1")


def _check_answers(store: GalleryStore, rng: np.random.Generator, seen: set[str]) -> int:
    """Query ``store`` in two serving modes; every query gets K distinct hits, each in a space of
    the store. Returns the queries answered."""
    answered = 0
    for searcher in psi_searchers(store):
        hits = searcher.search(rng.normal(size=(3, NEW.dim)).astype(np.float32), K)
        for ids, spaces in zip(hits.item_ids, hits.spaces, strict=True):
            assert len(set(ids)) == K, ids
            assert set(spaces) <= {OLD.name, NEW.name}, spaces
            seen.update(spaces)
        answered += len(hits.item_ids)
    return answered


# ----- ingest and provenance ---------------------------------------------------------------------
def test_ingest_stores_each_vector_with_its_space_model_and_checksum(
    backend: BackendSettings, tmp_path: Path
) -> None:
    vectors = np.random.default_rng(0).normal(size=(300, OLD.dim)).astype(np.float32)
    build_gallery(tmp_path / "s", 300, backend=backend).close()
    with GalleryStore.open(tmp_path / "s") as store:
        assert store.backend_settings.kind == backend.kind
        np.testing.assert_array_equal(store.read_vectors(OLD.name, np.arange(300)), vectors)
        slots = np.array([0, 7, 299])
        records = store.provenance(OLD.name, slots)
        sums = vector_checksums(vectors[slots])
        assert [(r["slot"], r["space"], r["model_ref"], r["checksum"]) for r in records] == [
            (int(s), OLD.name, OLD.model_ref, f"{int(c):016x}") for s, c in zip(slots, sums)
        ]
        assert store.verify_vectors(OLD.name) == 300


def test_vectors_of_the_wrong_dimension_or_space_are_refused(
    backend: BackendSettings, tmp_path: Path
) -> None:
    rng = np.random.default_rng(0)
    gen0 = SpaceSpec("gen0", 16, model_ref="models/gen0")
    with GalleryStore.create(tmp_path / "s", backend) as store:
        store.ingest([f"a{i}" for i in range(20)], rng.normal(size=(20, 16)), gen0)
        with pytest.raises(UserError, match="have dimension 12"):
            store.ingest(["b0"], rng.normal(size=(1, 12)), gen0)
        # Same name and dimension, another model: mixing it in would corrupt the space silently.
        imposter = SpaceSpec("gen0", 16, model_ref="models/gen0-retrained")
        with pytest.raises(UserError, match="holds vectors of model models/gen0"):
            store.ingest(["b0"], rng.normal(size=(1, 16)), imposter)
        with pytest.raises(UserError, match="have dimension 12"):
            store.write_vectors("gen0", np.array([0]), rng.normal(size=(1, 12)))
        assert store.item_count() == 20
        assert store.verify_vectors("gen0") == 20
        # A vector replaced behind the store's back no longer matches its recorded checksum.
        slot = np.array([5])
        held = store.space("gen0")
        store.vectors.write(
            held,
            VectorRows(
                slot,
                rng.normal(size=(1, 16)).astype(np.float32),
                store.vectors.checksums(held, slot),
                np.zeros(1, np.uint64),
            ),
        )
        store.vectors.sync(held)
        with pytest.raises(UserError, match="do not match what was recorded.*slot 5"):
            store.verify_vectors("gen0")


# ----- crash safety ------------------------------------------------------------------------------


def test_sigkill_at_random_points_then_resume_equals_an_uninterrupted_run(
    backend: BackendSettings, tmp_path: Path
) -> None:
    with build_gallery(tmp_path / "reference", N_ITEMS, backend=backend) as store:
        assert psi_job(store, chunk=CHUNK, seed=0).run().status == "complete"
        expected = final_state(store)

    store_path = tmp_path / "crashed"
    with build_gallery(store_path, N_ITEMS, backend=backend) as store:
        plan_psi_backfill(store, CHUNK)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    rng = np.random.default_rng(2024)
    kills, progress, answered, seen = 0, [], 0, set()
    for _ in range(3):
        with GalleryStore.open(store_path) as watcher:
            kills += kill_after_a_commit(watcher, script, 0.02, rng, wait=60, jitter=0.1)
            progress.append(len(watcher.backfills.chunk_log()))
            # The killed job's store answers every query, half in one space, half in the other.
            answered += _check_answers(watcher, rng, seen)
    process = spawn_backfill_worker(store_path, script, delay=0.0)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert out.split()[0] == "complete"
    assert kills == 3, f"the job finished too fast to be killed (progress {progress})"
    assert 0 < progress[0] < progress[-1] < len(expected[2]), progress
    assert answered > 0 and seen == {OLD.name, NEW.name}

    with GalleryStore.open(store_path) as store:
        states, vectors, chunks = final_state(store)
        assert store.verify_vectors(NEW.name) == N_ITEMS
    assert states == expected[0]
    np.testing.assert_array_equal(vectors, expected[1])
    assert chunks == expected[2]  # every chunk committed once, with bit-identical vectors


# ----- serving -----------------------------------------------------------------------------------
def test_every_query_is_answered_while_a_backfill_writes(
    backend: BackendSettings, tmp_path: Path
) -> None:
    def slow_psi(vectors: np.ndarray) -> np.ndarray:
        time.sleep(0.02)
        return psi(vectors)

    with build_gallery(tmp_path / "s", N_ITEMS, backend=backend) as store:
        plan_psi_backfill(store, CHUNK)
        job = BackfillJob(
            store,
            NEW,
            TransformStored(slow_psi),
            build_ordering("old-confidence"),
            CHUNK,
            progress=False,
        )
        outcome: list[str] = []
        writer = threading.Thread(target=lambda: outcome.append(job.run().status))
        writer.start()
        rng = np.random.default_rng(1)
        answered, seen, done_seen = 0, set(), set()
        while writer.is_alive():
            answered += _check_answers(store, rng, seen)
            state = store.status().backfill
            done_seen.add(0 if state is None else state.done)
        writer.join()
        assert outcome == ["complete"]
        assert answered > 0 and seen == {OLD.name, NEW.name}
        assert len(done_seen) > 2, "the queries did not run while the backfill wrote"
        _check_answers(store, rng, seen)


def _power_loss(*args: object, **kwargs: object) -> None:
    raise OSError("simulated power loss after the vectors were written")


def test_both_backends_give_the_same_answers_in_every_serving_mode(tmp_path: Path) -> None:
    calls: list[int] = []
    real_search = MilvusVectors.search

    def counted(self: MilvusVectors, *args: object, **kwargs: object) -> object:
        calls.append(1)
        return real_search(self, *args, **kwargs)  # type: ignore[arg-type]

    rng = np.random.default_rng(5)
    queries = QueryVectors(
        rng.normal(size=(6, NEW.dim)).astype(np.float32),
        rng.normal(size=(6, OLD.dim)).astype(np.float32),
    )
    modes = [
        ("rank-merge-rqt", HeadTransforms(reverse=reverse)),
        ("mixed", HeadTransforms(forward=psi)),
        ("rank-merge", HeadTransforms()),
    ]
    answers = {}
    for kind in ("embedded", "milvus"):
        with build_gallery(tmp_path / kind, 600, backend=BackendSettings(kind=kind)) as store:
            job = psi_job(store, chunk=CHUNK, seed=0)
            assert job.run(max_chunks=5).status == "paused"
            with pytest.MonkeyPatch.context() as patch:
                # A crash between writing the next chunk's vectors and committing it: those rows
                # are stored in the new space, but no item points at them yet.
                patch.setattr(store.backfills, "commit_chunks", _power_loss)
                with pytest.raises(OSError):
                    job.run(max_chunks=1)
            assert store.status().backfill.done == 5 * CHUNK
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(MilvusVectors, "search", counted)
                answers[kind] = [
                    Searcher(store, build_serving_mode(mode), heads=heads).search(queries, k)
                    for mode, heads in modes
                    for k in (1, K, 40)
                ]
    assert calls, "the Milvus store did not search with Milvus"
    for embedded, milvus in zip(answers["embedded"], answers["milvus"], strict=True):
        np.testing.assert_array_equal(milvus.item_ids, embedded.item_ids)
        np.testing.assert_array_equal(milvus.spaces, embedded.spaces)
        np.testing.assert_array_equal(milvus.distances, embedded.distances)


# ----- the commands ------------------------------------------------------------------------------
def _gallery_and_its_new_vectors(tmp_path: Path, n: int, backend: BackendSettings) -> np.ndarray:
    """A store ``tmp_path``/s of ``n`` items, and what ``store backfill --vectors --items`` reads:
    their NEW vectors (new.npy, ψ of the stored ones, returned) and ids (items.parquet)."""
    import pandas as pd

    with build_gallery(tmp_path / "s", n, backend=backend) as store:
        new_vectors = psi(store.read_vectors(OLD.name, np.arange(n)))
    np.save(tmp_path / "new.npy", new_vectors)
    pd.DataFrame({"item_id": [f"item-{i:05d}" for i in range(n)]}).to_parquet(
        tmp_path / "items.parquet"
    )
    return new_vectors


def test_the_store_commands_backfill_search_and_report_on_either_backend(
    backend: BackendSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from modelupgrade.cli.arguments import run_command
    from modelupgrade.commands.store import backfill, search, store_status

    new_vectors = _gallery_and_its_new_vectors(tmp_path, 200, backend)
    common = ["--params", str(PROJECT_PARAMS), "--store", str(tmp_path / "s")]
    run_command(
        backfill,
        [
            *common,
            *("--vectors", str(tmp_path / "new.npy"), "--items", str(tmp_path / "items.parquet")),
            *("--space", NEW.name, "--chunk-size", "64", "--no-progress"),
        ],
    )
    capsys.readouterr()
    run_command(store_status, [*common, "--json"])
    status = json.loads(capsys.readouterr().out)
    assert status["vectors"]["backend"] == backend.kind
    assert status["items_by_space"] == {NEW.name: 200}
    assert status["backfill"]["status"] == "complete"
    run_command(search, [*common, "--item-id", "item-00007", "--k", "3", "--mode", "mixed"])
    out = capsys.readouterr().out
    assert out.count(f"space={NEW.name}") == 3 and "item-00007" in out.splitlines()[1]
    with GalleryStore.open(tmp_path / "s") as store:
        np.testing.assert_array_equal(store.read_vectors(NEW.name, np.arange(200)), new_vectors)
        assert store.verify_vectors(NEW.name) == 200


def test_the_http_service_answers_from_either_backend(
    backend: BackendSettings, tmp_path: Path
) -> None:
    from fastapi.testclient import TestClient

    from modelupgrade.store.service import create_app

    with build_gallery(tmp_path / "s", 400, backend=backend) as store:
        assert psi_job(store, chunk=50, seed=0).run(max_chunks=4).status == "paused"
    queries = np.random.default_rng(0).normal(size=(2, NEW.dim)).astype(np.float32)
    heads = HeadTransforms(reverse=reverse)
    with GalleryStore.open(tmp_path / "s") as store:
        expected = Searcher(store, build_serving_mode("rank-merge-rqt"), heads=heads).search(
            queries, 7
        )
    app = create_app(tmp_path / "s", build_serving_mode("rank-merge-rqt"), top_k=7, heads=heads)
    with TestClient(app) as client:
        assert client.get("/health").json()["status"] == "ok"
        status = client.get("/backfill/status").json()
        assert status["vectors"]["backend"] == backend.kind
        assert status["backfill"]["done"] == 200
        body = client.post("/search", json={"vectors": queries.tolist()}).json()
    assert [[hit["item_id"] for hit in row] for row in body["results"]] == (
        expected.item_ids.tolist()
    )
    assert [[hit["space"] for hit in row] for row in body["results"]] == expected.spaces.tolist()


def test_a_milvus_lite_file_held_by_another_process_is_one_clear_error(tmp_path: Path) -> None:
    build_gallery(tmp_path / "s", 20, backend=BackendSettings(kind="milvus")).close()
    hold = (
        "import sys, time, numpy as np\n"
        "from modelupgrade.store import GalleryStore\n"
        f"store = GalleryStore.open({str(tmp_path / 's')!r})\n"
        "store.read_vectors('gen0', np.arange(3))\n"
        "print('holding', flush=True)\n"
        "time.sleep(60)\n"
    )
    holder = python_child("-c", hold)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with GalleryStore.open(tmp_path / "s") as store:
            assert store.item_count() == 20  # the ledger needs no Milvus
            with pytest.raises(UserError, match="cannot open the Milvus Lite file") as refused:
                store.read_vectors(OLD.name, np.arange(3))
            assert "one process at a time" in str(refused.value)
            assert "\n" not in refused.value.message
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    # The kernel drops a killed holder's lock: the file opens at once.
    with GalleryStore.open(tmp_path / "s") as store:
        assert store.read_vectors(OLD.name, np.arange(3)).shape == (3, OLD.dim)


def test_a_milvus_lite_index_file_cut_short_by_a_kill_is_rebuilt(tmp_path: Path) -> None:
    """Milvus Lite writes a segment's index file in place (no temporary file and rename): a
    process killed while writing it leaves a short file that Lite cannot load ("No data left in
    file") on every later open. It is a cache of the segment's vectors, so the store rebuilds it.
    """
    build_gallery(tmp_path / "s", 20, backend=BackendSettings(kind="milvus")).close()
    caches = list((tmp_path / "s").rglob("*.idx"))
    assert caches, "Milvus Lite wrote no index file: the layout this test cuts has changed"
    for cache in caches:
        cache.write_bytes(b"")  # what a kill left in CI
    with GalleryStore.open(tmp_path / "s") as store:
        slots = np.arange(20)
        assert store.read_vectors(OLD.name, slots).shape == (20, OLD.dim)
        hits = Searcher(store, build_serving_mode("mixed")).search(
            np.ones((2, OLD.dim), np.float32), 5
        )
        assert all(len(set(row)) == 5 for row in hits.item_ids)


def test_params_yaml_names_the_backend_and_only_milvus_takes_a_uri() -> None:
    import yaml

    from modelupgrade.config import ParamsError, parse_params
    from modelupgrade.params import plugin_problems

    raw = yaml.safe_load(PROJECT_PARAMS.read_text())

    def store_problems(**store: str) -> list[str]:
        params = parse_params({**raw, "store": {**raw["store"], **store}})
        return [p for p in plugin_problems(params) if p.startswith("store.")]

    assert store_problems(backend="milvus", uri="http://milvus:19530") == []
    assert store_problems(backend="qdrant") == [
        "store.backend: unknown vector backend 'qdrant' (choose one of: embedded, milvus)"
    ]
    with pytest.raises(ParamsError, match="store.uri .* is the milvus backend's address"):
        store_problems(uri="http://milvus:19530")
    assert BackendSettings.of(parse_params(raw).store) == BackendSettings()


# ----- cutover, rollback, cleanup ----------------------------------------------------------------
CLASSES = 6


def _labelled_store(path: Path, backend: BackendSettings, n: int = 240) -> tuple:
    """A store of ``n`` labelled items whose old vectors are noisy and whose new ones (a table the
    backfill takes) are sharp, and a labelled query sample embedded both ways: the new space
    answers it better."""
    from modelupgrade.store import ItemSources
    from modelupgrade.store.shadow import QuerySample

    rng = np.random.default_rng(11)
    labels = np.arange(n) % CLASSES
    old_centres = rng.normal(size=(CLASSES, OLD.dim))
    new_centres = rng.normal(size=(CLASSES, NEW.dim))
    ids = [f"item-{i:05d}" for i in range(n)]
    store = GalleryStore.create(path, backend)
    store.ingest(
        ids,
        (old_centres[labels] + 1.5 * rng.normal(size=(n, OLD.dim))).astype(np.float32),
        OLD,
        ItemSources(ids, labels=labels.tolist()),
        scores={"old-confidence": rng.random(n)},
    )
    new_vectors = (new_centres[labels] + 0.3 * rng.normal(size=(n, NEW.dim))).astype(np.float32)
    q = np.arange(30) % CLASSES
    sample = QuerySample(
        q,
        (new_centres[q] + 0.3 * rng.normal(size=(30, NEW.dim))).astype(np.float32),
        (old_centres[q] + 1.5 * rng.normal(size=(30, OLD.dim))).astype(np.float32),
        "sample",
    )
    return store, ids, new_vectors, sample


def _table_job(store: GalleryStore, ids: list[str], vectors: np.ndarray) -> BackfillJob:
    from modelupgrade.store import TableVectors

    return BackfillJob(
        store,
        NEW,
        TableVectors(ids, vectors),
        build_ordering("old-confidence"),
        CHUNK,
        progress=False,
    )


def _served_spaces(store: GalleryStore) -> set[str]:
    hits = Searcher(store, build_serving_mode("mixed"), heads=HeadTransforms(forward=psi)).search(
        np.random.default_rng(3).normal(size=(2, NEW.dim)).astype(np.float32)
        if store.serving_space() == NEW.name
        else np.random.default_rng(3).normal(size=(2, OLD.dim)).astype(np.float32),
        K,
    )
    assert all(len(set(row)) == K for row in hits.item_ids)
    return {str(space) for row in hits.spaces for space in row}


def _milvus_alias(store: GalleryStore) -> str | None:
    vectors = store.vectors
    return vectors.serving_collection() if isinstance(vectors, MilvusVectors) else None


def test_cutover_rollback_cutover_then_cleanup(backend: BackendSettings, tmp_path: Path) -> None:
    import yaml

    from modelupgrade.config import parse_params
    from modelupgrade.store.cutover import cleanup, cutover, rollback
    from modelupgrade.store.shadow import QuerySample, shadow_evaluate

    params = parse_params(yaml.safe_load(PROJECT_PARAMS.read_text()))
    store, ids, new_vectors, sample = _labelled_store(tmp_path / "s", backend)
    old_vectors = store.read_vectors(OLD.name, np.arange(len(ids)))
    window = params.store.rollback_window_hours

    def shadow(backfill):  # type: ignore[no-untyped-def]
        return shadow_evaluate(store, backfill, sample, params)

    with store:
        with pytest.raises(UserError, match="never been backfilled"):
            cutover(store, "go", window, shadow)
        job = _table_job(store, ids, new_vectors)
        assert job.run(max_chunks=1).status == "paused"
        with pytest.raises(UserError, match="is not complete"):
            cutover(store, "go", window, shadow)
        with pytest.raises(UserError, match="is not complete"):
            rollback(store, "back")
        assert job.run().status == "complete"
        assert store.status().cutover.state == "awaiting cutover"

        # New-space answers worse than the old space's: refused, nothing changes.
        noise = np.random.default_rng(0).normal(size=sample.new.shape).astype(np.float32)
        worse = QuerySample(sample.labels, noise, sample.old, "noise")
        with pytest.raises(UserError, match="shadow evaluation failed.*shadow: FAIL"):
            cutover(store, "go", window, lambda b: shadow_evaluate(store, b, worse, params))
        assert store.status().serving_steps == []
        with pytest.raises(UserError, match="needs a reason"):
            cutover(store, "  ", window, shadow)

        first = cutover(store, "TICKET-1: shadow mAP up", window, shadow)
        assert first.step == "cutover" and first.reason == "TICKET-1: shadow mAP up"
        evaluation = first.detail.shadow_evaluation
        assert evaluation is not None and evaluation["passed"] and evaluation["metric"] == "mAP"
        assert evaluation["new_metrics"]["mAP"] >= evaluation["old_metrics"]["mAP"]
        assert store.serving_space() == NEW.name and _served_spaces(store) == {NEW.name}
        if backend.kind == "milvus":
            assert _milvus_alias(store) == store.vectors.collection(store.space(NEW.name))
        with pytest.raises(UserError, match="already cut over"):
            cutover(store, "again", window, shadow)
        with pytest.raises(UserError, match="rollback window .* is open until"):
            cleanup(store, "tidy")

        back = rollback(store, "TICKET-2: complaints")
        assert back.detail.items_moved == len(ids)
        assert store.serving_space() == OLD.name and _served_spaces(store) == {OLD.name}
        assert {s["space"] for s in store.backfills.item_states()} == {OLD.name}
        np.testing.assert_array_equal(
            store.read_vectors(OLD.name, np.arange(len(ids))), old_vectors
        )
        if backend.kind == "milvus":
            assert _milvus_alias(store) == store.vectors.collection(store.space(OLD.name))
        with pytest.raises(UserError, match="already rolled back"):
            rollback(store, "again")
        with pytest.raises(UserError, match="was rolled back"):
            cleanup(store, "tidy", force=True)

        again = cutover(store, "TICKET-3: fixed", window, shadow)
        assert again.detail.items_moved == len(ids)
        assert _served_spaces(store) == {NEW.name}
        np.testing.assert_array_equal(
            store.read_vectors(NEW.name, np.arange(len(ids))), new_vectors
        )
        # Past the window no --force is needed.
        done = cleanup(store, "window over", now=again.at + window * 3600 + 1)
        assert done.detail == StepDetail(
            dropped_space=OLD.name, forced=False, window_ended_at=again.at + window * 3600
        )
        with pytest.raises(UserError, match="vectors were dropped by the cleanup"):
            rollback(store, "too late")
        with pytest.raises(UserError, match="is final"):
            cutover(store, "again", window, shadow)
        assert _served_spaces(store) == {NEW.name}
        status = store.status()
    if backend.kind == "embedded":
        assert not (tmp_path / "s" / "vectors" / f"{OLD.name}.f32").exists()
    else:
        with GalleryStore.open(tmp_path / "s") as reopened:
            assert reopened.space(OLD.name).storage not in reopened.vectors.stored()
    assert [s.step for s in status.serving_steps] == [
        "cutover",
        "rollback",
        "cutover",
        "cleanup",
    ]
    assert all("@" in s.actor and s.at > 0 for s in status.serving_steps)
    assert [s.reason for s in status.serving_steps][:2] == [
        "TICKET-1: shadow mAP up",
        "TICKET-2: complaints",
    ]
    assert asdict(status.cutover) == {
        "state": "cleaned up",
        "new_space": NEW.name,
        "old_space": OLD.name,
        "old_vectors": "dropped",
        "rollback_window_ends_at": None,
    }


def test_the_cutover_commands_record_each_step_in_store_status(
    backend: BackendSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pandas as pd

    from modelupgrade.cli.arguments import run_command
    from modelupgrade.commands.store import cleanup, cutover, rollback, store_status

    store, ids, new_vectors, sample = _labelled_store(tmp_path / "s", backend)
    with store:
        assert _table_job(store, ids, new_vectors).run().status == "complete"
    pd.DataFrame({"item_id": [f"q{i}" for i in range(30)], "label": sample.labels}).to_parquet(
        tmp_path / "q.parquet"
    )
    np.save(tmp_path / "new.npy", sample.new)
    np.save(tmp_path / "old.npy", sample.old)
    common = ["--params", str(PROJECT_PARAMS), "--store", str(tmp_path / "s")]
    run_command(
        cutover,
        [
            *common,
            *("--reason", "shadow ok", "--query-split", str(tmp_path / "q.parquet")),
            *("--new-query-vectors", str(tmp_path / "new.npy")),
            *("--old-query-vectors", str(tmp_path / "old.npy")),
        ],
    )
    shown = capsys.readouterr().out  # text by default, the shadow evaluation's verdict in it
    assert shown.startswith(f"cutover of backfill 1: serving {NEW.name} (was {OLD.name})\n")
    assert "\n  shadow evaluation: passed on 30 queries; mAP " in shown
    assert "\n  rollback window:   " in shown
    run_command(rollback, [*common, "--reason", "regression"])
    with pytest.raises(SystemExit) as refused:
        run_command(cleanup, [*common, "--reason", "tidy", "--force"])
    assert refused.value.code == 2
    assert "error: cannot clean up: backfill 1" in capsys.readouterr().err
    capsys.readouterr()
    run_command(store_status, [*common, "--json"])
    status = json.loads(capsys.readouterr().out)
    assert [(s["step"], s["reason"]) for s in status["serving_steps"]] == [
        ("cutover", "shadow ok"),
        ("rollback", "regression"),
    ]
    assert status["cutover"]["state"] == "rolled back"
    assert status["serving_space"] == OLD.name


def test_a_store_of_the_previous_schema_is_migrated_when_opened(tmp_path: Path) -> None:
    import sqlite3

    from modelupgrade.store.schema import SCHEMA_VERSION

    build_gallery(tmp_path / "s", 10).close()
    with sqlite3.connect(tmp_path / "s" / "store.sqlite") as db:
        db.execute("DROP TABLE serving_steps")
        db.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    with GalleryStore.open(tmp_path / "s") as store:
        assert store.item_count() == 10
        assert store.status().serving_steps == []
        (version,) = store.db.query("SELECT value FROM meta WHERE key = 'schema_version'")[0]
    assert version == str(SCHEMA_VERSION)


def test_a_store_of_schema_5_gives_each_backfill_a_serving_unit_of_its_own(tmp_path: Path) -> None:
    """Schema 5 stepped each backfill alone: migrated, each is a unit of its own (its id)."""
    import sqlite3

    from tests.store_helpers import psi_job

    with build_gallery(tmp_path / "s", 10) as store:
        psi_job(store, chunk=5).run()
    with sqlite3.connect(tmp_path / "s" / "store.sqlite") as db:
        db.execute("ALTER TABLE backfills DROP COLUMN unit")
        db.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    with GalleryStore.open(tmp_path / "s") as store:
        assert store.db.query("SELECT id, unit FROM backfills") == [(1, 1)]
        assert store.backfills.last().unit == 1  # type: ignore[union-attr]


# ----- cost and ETA preview ----------------------------------------------------------------------
def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_the_dry_run_previews_items_rate_and_time_and_writes_nothing(
    backend: BackendSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from modelupgrade.cli.arguments import run_command
    from modelupgrade.commands.store import backfill
    from modelupgrade.store.preview import preview_backfill

    _gallery_and_its_new_vectors(tmp_path, 400, backend)
    before = _files(tmp_path / "s")
    with GalleryStore.open(tmp_path / "s") as store:
        preview = preview_backfill(store, NEW, TransformStored(psi))
    assert preview.items_to_move == 400 and preview.resumes_backfill is None
    assert preview.method == "transform" and preview.sampled_items == 128
    assert preview.items_per_second > 0 and preview.measured_seconds > 0
    assert preview.estimated_seconds == pytest.approx(400 / preview.items_per_second)

    def slow_psi(vectors: np.ndarray) -> np.ndarray:
        time.sleep(0.02)
        return psi(vectors)

    with GalleryStore.open(tmp_path / "s") as store:
        timed = preview_backfill(store, NEW, TransformStored(slow_psi))
    # 128 items per call of at least 20 ms: at most 6,400 items/s, and not far below.
    assert 1000 < timed.items_per_second <= 6400, timed
    run_command(
        backfill,
        [
            *("--params", str(PROJECT_PARAMS), "--store", str(tmp_path / "s"), "--dry-run"),
            *("--vectors", str(tmp_path / "new.npy"), "--items", str(tmp_path / "items.parquet")),
            *("--space", NEW.name, "--json"),
        ],
    )
    shown = json.loads(capsys.readouterr().out)
    assert shown["items_to_move"] == 400 and shown["method"] == "table"
    assert shown["items_per_second"] > 0 and shown["estimated_seconds"] > 0
    assert _files(tmp_path / "s") == before  # byte for byte: no lock, no space, no plan
    with GalleryStore.open(tmp_path / "s") as store:
        assert store.backfills.last() is None and set(store.spaces()) == {OLD.name}


def test_the_dry_run_refuses_a_policy_whose_score_the_store_lacks_as_the_run_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The dry run makes the run's checks: ordering by a score the store was not ingested with is
    refused by both, with the same line, before anything is measured or written."""
    from modelupgrade.cli.arguments import run_command
    from modelupgrade.commands.store import backfill

    _gallery_and_its_new_vectors(tmp_path, 40, BackendSettings())
    flags = [
        *("--params", str(PROJECT_PARAMS), "--store", str(tmp_path / "s")),
        *("--vectors", str(tmp_path / "new.npy"), "--items", str(tmp_path / "items.parquet")),
        *("--space", NEW.name, "--policy", "old-entropy"),
    ]
    refusals = []
    for dry_run in (["--dry-run"], []):
        with pytest.raises(SystemExit):
            run_command(backfill, [*flags, *dry_run])
        refusals.append(capsys.readouterr().err)
    assert "holds no 'old-entropy' scores" in refusals[0]
    assert refusals[0] == refusals[1]
    with GalleryStore.open(tmp_path / "s") as store:
        assert store.backfills.last() is None and set(store.spaces()) == {OLD.name}
