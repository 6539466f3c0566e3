"""The store keeps its word under races, corruption and hostile clients (issue 30): one test per
numbered finding, each on every backend where it applies (``backend``: embedded, Milvus Lite, the
Milvus standalone server). The HTTP service's limits are in ``test_store_service_limits``, the
fault-injection sweep over every writer's commit boundaries in ``test_store_faults``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from modelupgrade.errors import EXIT_INCOMPLETE, UserError
from modelupgrade.models import save_model
from modelupgrade.ordering import build_ordering
from modelupgrade.serving import build_serving_mode
from modelupgrade.store import (
    BackendSettings,
    BackfillJob,
    GalleryStore,
    HeadTransforms,
    ImageFileSource,
    ItemSources,
    ReEmbedImages,
    Searcher,
    SpaceSpec,
    TransformStored,
    abort_backfill,
)
from tests.model_fixtures import tiny_model
from tests.store_helpers import (
    NEW,
    OLD,
    PROJECT_ROOT,
    backend_params,
    build_gallery,
    milvus_lite,
    psi,
    psi_job,
    python_child,
    reverse,
    write_images,
)

DIM = 8
MODELUPGRADE = str(Path(sys.executable).parent / "modelupgrade")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny 8-d model whose space the ingests' vectors are in."""
    root = tmp_path_factory.mktemp("model")
    torch.manual_seed(0)
    save_model(tiny_model(DIM), root / "gen0", {"generation": 0})
    return root / "gen0"


def _table(directory: Path, name: str, ids: list[str], seed: int) -> tuple[Path, Path]:
    """An item table (a split parquet) of ``ids`` and their 8-d vectors (.npy)."""
    items, vectors = directory / f"{name}.parquet", directory / f"{name}.npy"
    pd.DataFrame(
        {"item_id": ids, "path": [f"{i}.png" for i in ids], "index": -1, "label": 0}
    ).to_parquet(items)
    np.save(vectors, np.random.default_rng(seed).normal(size=(len(ids), DIM)).astype(np.float32))
    return items, vectors


def _command(*argv: str, params: Path, **env: str) -> subprocess.Popen[str]:
    """``modelupgrade argv`` with ``params``, as its own process."""
    return subprocess.Popen(
        [MODELUPGRADE, argv[0], "--params", str(params), *argv[1:]],
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finished(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


# ----- 1. two ingests into a new store -----------------------------------------------------------
def test_two_ingests_into_a_new_store_both_land_in_it(
    backend: BackendSettings, tmp_path: Path, model_dir: Path
) -> None:
    """Both start before either has created the store: the second waits for the commit lock the
    first created it under, then adds its items to it (before: each built a store aside and
    renamed it into place, and the second rename replaced the first store)."""
    params = backend_params(tmp_path, backend)
    rounds = 1 if milvus_lite(backend) else 2
    for round_ in range(rounds):
        store = tmp_path / f"store{round_}"
        tables = [
            _table(tmp_path, f"{side}{round_}", [f"{side}{i}" for i in range(300)], seed)
            for seed, side in enumerate("ab")
        ]
        ingests = [
            _command(
                "store-ingest",
                *("--store", str(store), "--items", str(items), "--model", str(model_dir)),
                *("--vectors", str(vectors), "--score"),
                params=params,
            )
            for items, vectors in tables
        ]
        for process in ingests:
            code, _, err = _finished(process)
            assert code == 0, err
        with GalleryStore.open(store) as gallery:
            assert gallery.item_count() == 600
            by_id = {item.item_id: item.slot for item in gallery.items()}
            for items, vectors in tables:
                ids = pd.read_parquet(items)["item_id"].tolist()
                stored = gallery.read_vectors("gen0", np.array([by_id[i] for i in ids]))
                np.testing.assert_array_equal(stored, np.load(vectors))


def test_a_second_creator_waits_for_the_first_ones_lock_and_creates_nothing_meanwhile(
    backend: BackendSettings, tmp_path: Path
) -> None:
    """The race of the test above, made certain: while one process holds the commit lock of a
    store it is creating, another that finds no store creates nothing (no database appears); once
    the lock is let go it looks again, opens the first one's store and ingests into it (before:
    creation took no lock, and a second creator wrote its own store over the first)."""
    from modelupgrade.store.backends import VECTOR_BACKENDS
    from modelupgrade.store.lock import COMMIT_HOLDER_FILE, COMMIT_LOCK_FILE, WriterLock
    from modelupgrade.store.schema import DATABASE_FILE

    path = tmp_path / "s"
    path.mkdir()
    second = textwrap.dedent(
        f"""
        import numpy as np
        from modelupgrade.store import BackendSettings, GalleryStore
        from tests.store_helpers import OLD
        print("started", flush=True)
        backend = BackendSettings(kind={backend.kind!r}, uri={backend.uri!r})
        store, created = GalleryStore.open_or_create({str(path)!r}, backend)
        with store:
            store.ingest(["b-0"], np.ones((1, OLD.dim), np.float32), OLD)
        print("created" if created else "opened", flush=True)
        """
    )
    with WriterLock(path, COMMIT_LOCK_FILE, COMMIT_HOLDER_FILE).hold("create a gallery store"):
        creator = python_child("-c", second)
        assert creator.stdout is not None and creator.stdout.readline().strip() == "started"
        try:
            creator.wait(timeout=3)  # a creator that takes no lock has made its store by now
        except subprocess.TimeoutExpired:
            pass
        assert creator.poll() is None, "the second creator did not wait for the lock"
        assert not (path / DATABASE_FILE).exists()
        first = VECTOR_BACKENDS.get(backend.kind).prepared(path, backend)
        GalleryStore._created(path, first).close()  # the first creator's work
    out, err = creator.communicate(timeout=120)
    # it looked again under the lock, and opened the first creator's store
    assert creator.returncode == 0 and out.strip() == "opened", err
    with GalleryStore.open(path) as store:
        assert [item.item_id for item in store.items()] == ["b-0"]


# ----- 2. a service never answers from files that no longer back the store ---------------------
def test_a_service_follows_a_space_dropped_and_created_again(
    backend: BackendSettings, tmp_path: Path
) -> None:
    from fastapi.testclient import TestClient

    from modelupgrade.store.service import create_app

    path = tmp_path / "s"
    build_gallery(path, 300, backend=backend).close()
    heads = HeadTransforms(reverse=reverse)
    mode = build_serving_mode("rank-merge-rqt")
    queries = np.random.default_rng(4).normal(size=(3, NEW.dim)).astype(np.float32)
    with TestClient(create_app(path, mode, top_k=5, heads=heads)) as client:
        with GalleryStore.open(path) as writer:
            assert psi_job(writer, chunk=30, seed=0).run(max_chunks=5).status == "paused"
            assert client.post("/search", json={"vectors": queries.tolist()}).status_code == 200
            abort_backfill(writer)
            # the same space again, with other vectors (another model of the same size)
            other = BackfillJob(
                writer, NEW, TransformStored(lambda v: -psi(v)), build_ordering("random"), 30
            )
            assert other.run(max_chunks=5).status == "paused"
            expected = Searcher(writer, mode, heads=heads).search(queries, 5)
            if milvus_lite(backend):
                writer.vectors.close()  # Milvus Lite: one process, one client at a time
        served = client.post("/search", json={"vectors": queries.tolist()}).json()
        assert [[hit["item_id"] for hit in row] for row in served["results"]] == (
            expected.item_ids.tolist()
        )
        np.testing.assert_allclose(
            [[hit["distance"] for hit in row] for row in served["results"]],
            expected.distances,
            rtol=1e-6,
        )
        assert client.get("/health").status_code == 200
        # The store directory removed under the service: it must not go on answering from it.
        shutil.rmtree(path)
        health = client.get("/health")
        assert health.status_code == 503, health.text
        assert "removed or replaced" in health.json()["error"]


# ----- 3. a Milvus alias move and its record, one recoverable step ------------------------------
def _complete_store(path: Path, backend: BackendSettings) -> GalleryStore:
    """A store whose backfill into NEW is complete and cut over (a shadow evaluation passed)."""
    from modelupgrade.registry.gates import GateCheck
    from modelupgrade.store.cutover import cutover
    from modelupgrade.store.shadow import ShadowEvaluation

    store = build_gallery(path, 200, backend=backend)
    assert psi_job(store, chunk=50, seed=0).run().status == "complete"
    passed = ShadowEvaluation("mAP", NEW.name, OLD.name, 1, 200, {}, {}, 0.0)
    passed.checks.append(GateCheck("shadow", True, 1.0, 0.0, "test"))
    cutover(store, "go", 168.0, lambda backfill: passed)
    return store


_STEP = """
import sys
from modelupgrade.store import GalleryStore
from modelupgrade.store.cutover import {step}
with GalleryStore.open(sys.argv[1]) as store:
    {step}(store, "a reason")
"""


def test_a_kill_between_the_alias_move_and_its_record_is_completed_by_the_next_writer(
    backend: BackendSettings, tmp_path: Path
) -> None:
    """SIGKILL inside a rollback after the alias moved, before the database recorded it: the
    store shows the interrupted rollback, and the next writer completes it before it does anything
    (before: store-status showed nothing wrong and a later cleanup --force dropped the collection
    the alias pointed at)."""
    from modelupgrade.store.cutover import cleanup
    from modelupgrade.store.verify import verify

    if backend.kind != "milvus":
        pytest.skip("only a vector database has an alias of its own to move")
    path = tmp_path / "s"
    _complete_store(path, backend).close()
    killed = subprocess.run(
        [sys.executable, "-c", _STEP.format(step="rollback"), str(path)],
        cwd=PROJECT_ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(PROJECT_ROOT),
            "MODELUPGRADE_KILL_AT": "rollback:backend",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with GalleryStore.open(path) as store:
        gen0 = store.vectors.collection(store.space(OLD.name))
        assert store.vectors.serving_collection() == gen0  # moved, not yet recorded
        status = store.status()
        assert status.serving_space == NEW.name and status.pending_intents == ["rollback"]
        report = verify(store)
        assert report.inconsistencies == 0, report.describe()
        assert any("rollback was interrupted" in note for note in report.pending)
        with pytest.raises(UserError, match="was rolled back"):
            cleanup(store, "tidy", force=True)  # the next writer completed the rollback first
        assert store.serving_space() == OLD.name
        assert store.vectors.serving_collection() == gen0
        assert [step.step for step in store.status().serving_steps] == ["cutover", "rollback"]
        assert verify(store).inconsistencies == 0 and store.status().pending_intents == []


def test_store_verify_finds_the_serving_alias_moved_behind_the_store(
    backend: BackendSettings, tmp_path: Path
) -> None:
    """The alias clients search, moved back to the old space's collection by someone other than
    the store after its cutover: store-verify compares it with the store's last step."""
    from modelupgrade.store.verify import verify

    if backend.kind != "milvus":
        pytest.skip("only a vector database has an alias of its own to move")
    with _complete_store(tmp_path / "s", backend) as store:
        assert verify(store).inconsistencies == 0
        vectors = store.vectors
        gen0 = vectors.collection(store.space(OLD.name))  # type: ignore[attr-defined]
        vectors.client().alter_alias(gen0, vectors.alias)  # type: ignore[attr-defined]
        report = verify(store)
    assert report.inconsistencies == 1
    assert f"the serving alias points at {gen0}, the last cutover at" in report.describe()


# ----- 4. corruption is detected -----------------------------------------------------------------
def _verify_command(path: Path, params: Path) -> tuple[int, str, str]:
    return _finished(_command("store-verify", "--store", str(path), params=params))


def test_store_verify_finds_a_vector_changed_behind_the_store(
    backend: BackendSettings, tmp_path: Path
) -> None:
    from modelupgrade.store.backends.base import VectorRows

    path, params = tmp_path / "s", backend_params(tmp_path, backend)
    with build_gallery(path, 120, backend=backend) as store:
        psi_job(store, chunk=40, seed=0).run(max_chunks=1)
    code, out, err = _verify_command(path, params)
    assert code == 0, out + err
    assert "0 inconsistencies" in out
    with GalleryStore.open(path) as store:
        spec, slot = store.space(OLD.name), np.array([17])
        if backend.kind == "embedded":
            _flip(path / "vectors" / f"{spec.storage}.f32", 17 * OLD.dim * 4 + 5)
        else:
            # another vector under the recorded checksum, written past the store
            tampered = store.read_vectors(OLD.name, slot) + 1.0
            store.vectors.write(
                spec,
                VectorRows(
                    slot, tampered, store.vectors.checksums(spec, slot), np.zeros(1, np.uint64)
                ),
            )
            store.vectors.sync(spec)
    code, out, err = _verify_command(path, params)
    assert code == 1, out + err
    assert "space 'gen0', slot 17: the vector is not the one written" in out
    assert err.startswith("error: 1 inconsistency") and "hint:" in err


def test_store_verify_finds_a_vector_written_back_on_an_erased_items_slot(
    backend: BackendSettings, tmp_path: Path
) -> None:
    """A resurrection caught: the vector of an erased item written back past the store is found
    by reading the rows the backend holds against the item table (no search would show it)."""
    from modelupgrade.store.backends.base import VectorRows
    from modelupgrade.store.live import erase
    from modelupgrade.store.vectors import vector_checksums
    from modelupgrade.store.verify import verify

    with build_gallery(tmp_path / "s", 60, backend=backend) as store:
        spec, slot = store.space(OLD.name), np.array([5])
        vector = store.read_vectors(OLD.name, slot)
        erase(store, ["item-00005"], "a request to be forgotten")
        assert verify(store).inconsistencies == 0
        rows = VectorRows(slot, vector, vector_checksums(vector), np.zeros(1, np.uint64))
        store.vectors.write(spec, rows)
        store.vectors.sync(spec)
        report = verify(store)
    assert report.inconsistencies == 1
    assert "space 'gen0' holds 1 vector(s) of no item, e.g. slot 5" in report.describe()


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


def test_store_verify_finds_a_changed_checksum_and_a_duplicated_item_id(tmp_path: Path) -> None:
    params = backend_params(tmp_path, BackendSettings())
    path = tmp_path / "s"
    build_gallery(path, 60).close()
    _flip(path / "vectors" / "gen0.sum", 8 * 33 + 2)
    code, out, _ = _verify_command(path, params)
    assert code == 1 and "slot 33: the vector is not the one written" in out
    other = tmp_path / "t"
    build_gallery(other, 60).close()
    database = other / "store.sqlite"
    with sqlite3.connect(database) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = database.read_bytes()
    assert raw.count(b"item-00017") >= 1
    database.write_bytes(
        raw.replace(b"item-00017", b"item-00016", 1)
    )  # in the table, not its index
    code, out, err = _verify_command(other, params)
    assert code == 1, out + err
    assert "item id 'item-00016' is held by 2 items" in out or "database" in err


def _edit_in_table(path: Path, old: bytes, new: bytes) -> None:
    """Replace the first ``old`` in the store's database file with ``new``: inside the item table,
    not the index of its ids (which still says ``old``)."""
    database = path / "store.sqlite"
    with sqlite3.connect(database) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = database.read_bytes()
    assert raw.count(old) >= 1
    database.write_bytes(raw.replace(old, new, 1))


def test_the_services_check_on_open_finds_a_duplicated_item_id(tmp_path: Path) -> None:
    """Two items named ``item-00016`` behind an index that still says ``item-00017``: SQLite's
    quick_check (the service's, on open) does not compare the index with its table, so only the
    item check's full scan finds the duplicate."""
    from modelupgrade.store.verify import quick_check

    path = tmp_path / "s"
    build_gallery(path, 60).close()
    _edit_in_table(path, b"item-00017", b"item-00016")
    with GalleryStore.open(path) as store:
        report = quick_check(store)
    assert report.inconsistencies == 1, report.describe()
    assert "item id 'item-00016' is held by 2 items" in report.describe()


def test_store_verify_runs_sqlites_integrity_check(tmp_path: Path) -> None:
    """An item id changed inside the table alone, to one no other item holds: every item
    constraint still holds, and only SQLite's integrity_check (the index against its table)
    finds it."""
    params = backend_params(tmp_path, BackendSettings())
    path = tmp_path / "s"
    build_gallery(path, 60).close()
    _edit_in_table(path, b"item-00017", b"item-0001x")
    code, out, err = _verify_command(path, params)
    assert code == 1, out + err
    assert "database" in out and "index" in out, out


def test_a_damaged_database_page_is_one_error_line_and_a_503(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from modelupgrade.store.service import create_app

    params = backend_params(tmp_path, BackendSettings())
    path = tmp_path / "s"
    build_gallery(path, 2000).close()
    database = path / "store.sqlite"
    with sqlite3.connect(database) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = 4096
    with open(database, "r+b") as fh:  # a page of the item table, in its middle
        fh.seek(page * (len(database.read_bytes()) // page // 2))
        fh.write(os.urandom(page))
    for argv in (("store-status",), ("store-verify",), ("search", "--item-id", "item-00003")):
        code, out, err = _finished(_command(*argv, "--store", str(path), params=params))
        assert code in (1, 2), (argv, out, err)
        assert "Traceback" not in out + err, err
        assert "damaged" in err or "database" in out, (argv, out, err)
    with TestClient(create_app(path, build_serving_mode("mixed"))) as client:
        query = {"vectors": np.ones((1, OLD.dim)).tolist()}
        assert client.post("/search", json=query).status_code == 503
        assert client.get("/health").status_code == 503


# ----- 6. leftovers and tracebacks ---------------------------------------------------------------
def test_a_killed_new_store_ingest_leaves_no_copy_behind(
    backend: BackendSettings, tmp_path: Path, model_dir: Path
) -> None:
    """A new-store ingest SIGKILLed after storing its vectors, before committing them: the next
    writer removes them (and a store an earlier version built aside and never renamed)."""
    params = backend_params(tmp_path, backend)
    store = tmp_path / "s"
    aside = tmp_path / ".s.k1ll3d.tmp" / "s"  # what a killed earlier version left beside it
    build_gallery(aside, 50).close()
    items, vectors = _table(tmp_path, "killed", [f"k{i}" for i in range(200)], 0)
    code, _, err = _finished(
        _command(
            "store-ingest",
            *("--store", str(store), "--items", str(items), "--model", str(model_dir)),
            *("--vectors", str(vectors), "--score"),
            params=params,
            MODELUPGRADE_KILL_AT="ingest:vectors",
        )
    )
    assert code == -signal.SIGKILL, err
    survivors, survivor_vectors = _table(tmp_path, "next", [f"n{i}" for i in range(30)], 1)
    code, _, err = _finished(
        _command(
            "store-ingest",
            *("--store", str(store), "--items", str(survivors), "--model", str(model_dir)),
            *("--vectors", str(survivor_vectors), "--score"),
            params=params,
        )
    )
    assert code == 0, err
    assert not aside.parent.exists()
    with GalleryStore.open(store) as gallery:
        assert [item.item_id for item in gallery.items()] == [f"n{i}" for i in range(30)]
        held = gallery.vectors.present_slots(gallery.space("gen0"))  # read in the backend
        assert held.tolist() == [item.slot for item in gallery.items()]


def test_store_paths_that_are_links_are_followed_or_refused_in_one_line(
    tmp_path: Path, model_dir: Path
) -> None:
    params = backend_params(tmp_path, BackendSettings())
    items, vectors = _table(tmp_path, "items", [f"i{i}" for i in range(10)], 0)
    (tmp_path / "empty").mkdir()
    (tmp_path / "to-empty").symlink_to(tmp_path / "empty")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    common = (
        "--items",
        str(items),
        "--model",
        str(model_dir),
        "--vectors",
        str(vectors),
        "--score",
    )
    code, _, err = _finished(
        _command("store-ingest", "--store", str(tmp_path / "to-empty"), *common, params=params)
    )
    assert code == 0, err
    with GalleryStore.open(tmp_path / "empty") as gallery:
        assert gallery.item_count() == 10
    code, _, err = _finished(
        _command("store-ingest", "--store", str(tmp_path / "dangling"), *common, params=params)
    )
    assert code == 2 and "Traceback" not in err, err
    assert err.startswith("error: --store") and "does not exist" in err and "hint:" in err


def test_a_space_name_of_128_characters_makes_a_collection_milvus_takes(
    backend: BackendSettings, tmp_path: Path
) -> None:
    long = SpaceSpec("g" + "-x" * 63 + "z", OLD.dim)
    assert len(long.name) == 128
    with GalleryStore.create(tmp_path / "s", backend) as store:
        store.ingest(["a", "b"], np.eye(2, OLD.dim, dtype=np.float32), long)
        hits = Searcher(store, build_serving_mode("mixed")).search(np.eye(1, OLD.dim), 1)
        assert hits.item_ids.tolist() == [["a"]]


# ----- 7. exit codes and hints that a supervisor can trust ----------------------------------------
def test_running_a_completed_backfill_again_exits_0_and_says_so(
    backend: BackendSettings, tmp_path: Path
) -> None:
    from modelupgrade.store.report import BackfillReport

    with build_gallery(tmp_path / "s", 100, backend=backend) as store:
        assert psi_job(store, chunk=40).run().status == "complete"
        again: BackfillReport = psi_job(store, chunk=40).run()
    assert (again.status, again.exit_code, again.already_complete) == ("complete", 0, True)
    assert again.chunks_committed == 0 and again.backfill_id == 1


def test_readers_leave_the_journal_of_a_crashed_writer_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """store-status and search take no lock and redo nothing (the next writer does)."""
    params = backend_params(tmp_path, BackendSettings())
    path = tmp_path / "s"
    with build_gallery(path, 100) as store:
        monkeypatch.setattr(store.vectors, "checkpoint", lambda: None)  # killed before it
        psi_job(store, chunk=20).run(max_chunks=2)
    journal = path / "vectors" / f"{NEW.name}.journal"
    before = journal.read_bytes()
    assert before
    for argv in (("store-status",), ("search", "--item-id", "item-00001")):
        code, _, err = _finished(_command(*argv, "--store", str(path), params=params))
        assert code in (0, 2), err  # item-00001 may not be backfilled yet: a refusal is fine
        assert journal.read_bytes() == before
        assert not (path / "commit.json").exists() and not (path / "writer.json").exists()


def test_an_ingest_during_a_backfill_with_failed_items_joins_it(tmp_path: Path) -> None:
    from modelupgrade.store import TableVectors

    with build_gallery(tmp_path / "s", 60) as store:
        ids = [f"item-{i:05d}" for i in range(60) if i != 7]
        table = TableVectors(ids, np.ones((59, NEW.dim), np.float32))
        job = BackfillJob(store, NEW, table, build_ordering("ingest-order"), 20, progress=False)
        assert job.run().exit_code == EXIT_INCOMPLETE
        store.ingest(
            ["late"], np.ones((1, OLD.dim), np.float32), OLD, scores={"old-confidence": np.ones(1)}
        )
        late = {s["item_id"]: s for s in store.backfills.item_states()}["late"]
        assert (late["space"], late["state"]) == (OLD.name, "pending")


def test_a_checkpoint_that_would_run_code_is_refused_without_advice_to_run_it(
    tmp_path: Path, model_dir: Path
) -> None:
    from modelupgrade.io import file_sha256

    params = backend_params(tmp_path, BackendSettings())
    evil = tmp_path / "evil"
    shutil.copytree(model_dir, evil)
    script = textwrap.dedent(
        """
        import os, sys, torch
        class Payload:
            def __reduce__(self):
                return (os.system, ("touch " + sys.argv[2],))
        torch.save({"w": Payload()}, sys.argv[1])
        """
    )
    subprocess.run(
        [sys.executable, "-c", script, str(evil / "checkpoint.pt"), str(tmp_path / "pwned")],
        check=True,
    )
    card = json.loads((evil / "card.json").read_text())
    card["weights_sha256"]["checkpoint.pt"] = file_sha256(evil / "checkpoint.pt")
    (evil / "card.json").write_text(json.dumps(card))
    items, _ = _table(tmp_path, "items", ["a", "b"], 0)
    code, _, err = _finished(
        _command(
            "store-ingest",
            *("--store", str(tmp_path / "s"), "--items", str(items), "--model", str(evil)),
            "--score",
            params=params,
        )
    )
    assert code == 2 and not (tmp_path / "pwned").exists(), err
    assert "it asks to run" in err and "weights_only" not in err.split("hint:")[0], err
    assert "False" not in err and "Traceback" not in err, err


# ----- 8. the content each vector was made from -------------------------------------------------
def test_a_backfill_refuses_or_records_images_that_changed_since_their_vectors(
    backend: BackendSettings, tmp_path: Path
) -> None:
    from modelupgrade.store.ingest import ingest_images
    from modelupgrade.store.vectors import content_hashes

    root = write_images(tmp_path / "images", 40, 8)
    images = ImageFileSource(root)

    def embed(batch: np.ndarray, dim: int) -> np.ndarray:
        flat = batch.reshape(len(batch), -1).astype(np.float32)
        return flat[:, :dim] + 1.0

    path = tmp_path / "s"
    with GalleryStore.create(path, backend) as store:
        ingest_images(
            store,
            [f"img{i}" for i in range(40)],
            ItemSources([f"{i}.png" for i in range(40)]),
            images,
            lambda batch: embed(batch, OLD.dim),
            OLD,
        )
        recorded = {p["slot"]: p["source_hash"] for p in store.provenance(OLD.name, np.arange(40))}
        assert None not in recorded.values()
        swapped = [3, 11, 29]
        for i in swapped:  # the images behind three paths replaced during the backfill
            shutil.copy(root / f"{(i + 1) % 40}.png", root / f"{i}.png")
        source = ReEmbedImages(images, lambda batch: embed(batch, NEW.dim))
        job = BackfillJob(store, NEW, source, build_ordering("ingest-order"), 10, progress=False)
        report = job.run()
        assert (report.status, report.exit_code) == ("incomplete", EXIT_INCOMPLETE)
        assert {f.item_id for f in report.failed} == {f"img{i}" for i in swapped}
        assert all(
            "its image changed since its vector in 'gen0' was made" in f.reason
            for f in report.failed
        )
        # Accepted: re-embedded from the new images, whose content is recorded with the vectors.
        store.backfills.retry_failed()
        accepting = ReEmbedImages(images, lambda batch: embed(batch, NEW.dim), "accept")
        job = BackfillJob(store, NEW, accepting, build_ordering("ingest-order"), 10, progress=False)
        assert job.run().status == "complete" and len(accepting.changed) == 3
        now = content_hashes(images.load(store.items(np.array(swapped))).images)
        provenance = store.provenance(NEW.name, np.array(swapped))
        assert [p["source_hash"] for p in provenance] == [f"{int(h):016x}" for h in now]
        kept = store.provenance(NEW.name, np.array([0, 1]))
        assert [p["source_hash"] for p in kept] == [recorded[0], recorded[1]]


# ----- 6. a disk that fills ----------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted for the test (root only): a disk that really fills."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip()}): needs root")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_disk_full_when_the_backfill_is_planned_is_one_error_line_and_plans_nothing(
    tmp_path: Path, small_disk: Path
) -> None:
    """The store's disk with no room left for the backfill's plan: planning stops with one error
    line (before: a raw OperationalError), nothing is planned, and once space is freed the same
    command runs the backfill to its end."""
    params = backend_params(tmp_path, BackendSettings())
    n = 3000
    with build_gallery(small_disk / "s", n) as store:
        np.save(tmp_path / "new.npy", psi(store.read_vectors(OLD.name, np.arange(n))))
    pd.DataFrame({"item_id": [f"item-{i:05d}" for i in range(n)]}).to_parquet(
        tmp_path / "ids.parquet"
    )
    backfill = (
        "backfill",
        *("--store", str(small_disk / "s"), "--space", NEW.name, "--chunk-size", "64"),
        *("--vectors", str(tmp_path / "new.npy"), "--items", str(tmp_path / "ids.parquet")),
        *("--policy", "old-confidence", "--no-progress"),
    )
    stats = os.statvfs(small_disk)
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (stats.f_bavail * stats.f_frsize))  # not a byte left
    code, out, err = _finished(_command(*backfill, params=params))
    assert code == 2, (code, out, err)
    assert "Traceback" not in err, err
    line = next(line for line in err.splitlines() if line.startswith("error: "))
    assert line.startswith("error: the disk under the store at") and "is full" in line, line
    filler.unlink()
    with GalleryStore.open(small_disk / "s") as store:
        assert store.backfills.last() is None and set(store.spaces()) == {OLD.name}
    code, out, err = _finished(_command(*backfill, params=params))
    assert code == 0, err
    with GalleryStore.open(small_disk / "s") as store:
        assert store.backfills.last().status == "complete"  # type: ignore[union-attr]


def test_a_disk_that_fills_mid_backfill_is_one_error_line_and_resumes_bit_identical(
    tmp_path: Path, small_disk: Path
) -> None:
    """The store on a 2 MiB disk, filled up to just past what the new space's files take: the
    backfill stops with one error line when the disk fills (before: SIGBUS, exit 135, no message),
    and once space is freed, the same command finishes it, equal to a run that never stopped."""
    from modelupgrade.store import TableVectors
    from tests.store_helpers import final_state

    params = backend_params(tmp_path, BackendSettings())
    n = 3000
    ids = [f"item-{i:05d}" for i in range(n)]
    with build_gallery(tmp_path / "reference", n) as reference:
        new_vectors = psi(reference.read_vectors(OLD.name, np.arange(n)))
        job = BackfillJob(
            reference, NEW, TableVectors(ids, new_vectors), build_ordering("old-confidence"), 64
        )
        assert job.run().status == "complete"
        expected = final_state(reference)
    np.save(tmp_path / "new.npy", new_vectors)
    pd.DataFrame({"item_id": ids}).to_parquet(tmp_path / "ids.parquet")
    build_gallery(small_disk / "s", n).close()
    backfill = (
        "backfill",
        *("--store", str(small_disk / "s"), "--space", NEW.name, "--chunk-size", "64"),
        *("--vectors", str(tmp_path / "new.npy"), "--items", str(tmp_path / "ids.parquet")),
        *("--policy", "old-confidence", "--no-progress"),
    )
    stats = os.statvfs(small_disk)
    room = n * NEW.dim * 4 + 2 * n * 8 + 96_000  # the new space's files, and a little
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * max(0, stats.f_bavail * stats.f_frsize - room))
    code, out, err = _finished(_command(*backfill, params=params))
    assert code == 2, (code, out, err)
    assert "Traceback" not in err, err
    line = next(line for line in err.splitlines() if line.startswith("error: "))
    assert "full" in line or "no room" in line, err
    filler.unlink()
    code, out, err = _finished(_command(*backfill, params=params))
    assert code == 0, err
    with GalleryStore.open(small_disk / "s") as store:
        states, vectors, chunks = final_state(store)
    assert states == expected[0] and chunks == expected[2]
    np.testing.assert_array_equal(vectors, expected[1])


def test_a_vector_file_that_cannot_grow_on_a_full_disk_says_so_and_keeps_its_rows(
    small_disk: Path,
) -> None:
    """The preallocation of a vector file's new rows (the backstop behind the journal, which meets
    a full disk first in a backfill) on a disk with no room: a disk-full error naming what it needed
    and what is free, and the file still holds exactly the rows it had (its room is not claimed
    half-way, nor its rows lost)."""
    from modelupgrade.store.faults import DiskFull
    from modelupgrade.store.vectors import VectorFile

    vectors = VectorFile(small_disk / "gen1.f32", NEW.dim)
    vectors.ensure_rows(100)
    before = (small_disk / "gen1.f32").read_bytes()
    stats = os.statvfs(small_disk)
    (small_disk / "filler").write_bytes(b"\0" * (stats.f_bavail * stats.f_frsize))
    with pytest.raises(DiskFull, match=r"no room to store .* MiB of vectors .*MiB free"):
        vectors.ensure_rows(100_000)
    assert vectors.rows_on_disk() == 100
    assert (small_disk / "gen1.f32").read_bytes() == before
