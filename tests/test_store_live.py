"""A living gallery (issue 29, item 1): items ingested, updated and erased while a backfill runs in
another process that is SIGKILLed at random moments and resumed, on every backend. Afterwards every
live item is in the target space exactly once with the vector of its latest content, and no erased
item is in any search mode or in the stored vectors (read in the backend, not through search): not
after the resume, not after a rollback, not after a cleanup. And the commands that do it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pytest

from modelupgrade.serving import build_serving_mode
from modelupgrade.store import BackendSettings, GalleryStore, HeadTransforms, Searcher
from modelupgrade.store.faults import KILL_ENV
from modelupgrade.store.live import erase, update
from tests.store_helpers import (
    NEW,
    OLD,
    PROJECT_ROOT,
    build_gallery,
    command_output,
    milvus_lite,
    plan_psi_backfill,
    psi,
    reverse,
    slow_backfill_script,
    spawn_backfill_worker,
)

if TYPE_CHECKING:
    from modelupgrade.store.shadow import ShadowEvaluation

N_ITEMS, CHUNK = 600, 30


def _vector(item_id: str, version: int) -> np.ndarray:
    rng = np.random.default_rng(abs(hash((item_id, version))) % 2**32)
    return rng.normal(size=(1, OLD.dim)).astype(np.float32)


def _searchers(store: GalleryStore) -> list[Searcher]:
    return [
        Searcher(
            store, build_serving_mode("rank-merge-rqt"), heads=HeadTransforms(reverse=reverse)
        ),
        Searcher(store, build_serving_mode("mixed"), heads=HeadTransforms(forward=psi)),
        Searcher(store, build_serving_mode("rank-merge")),
    ]


def _absent(store: GalleryStore, erased: dict[str, np.ndarray], slots: set[int]) -> None:
    """No erased item in any search mode, its vectors in no space."""
    old_queries = np.concatenate(list(erased.values()))
    new_queries = old_queries if store.serving_space() == OLD.name else psi(old_queries)
    for searcher in _searchers(store):
        try:
            from modelupgrade.store import QueryVectors

            hits = searcher.search(QueryVectors(new_queries, old_queries), 20)
        except Exception as err:  # noqa: BLE001 - a mode that cannot serve this state
            assert "backward compatible" in str(err) or "cannot" in str(err), err
            continue
        assert not set(hits.item_ids.ravel()) & set(erased)
    present = store.vectors.present_slots  # type: ignore[attr-defined]
    for spec in store.spaces().values():
        if spec.storage in store.vectors.stored():
            assert not set(present(spec).tolist()) & slots, f"an erased vector in {spec.name}"


def _update(store: GalleryStore, changed: list[str], current: dict[str, np.ndarray]) -> None:
    """New content for ``changed``: its old-space vectors; and, where the backfill is done (a
    Milvus Lite round's worker can finish it before the kill), ψ of them for each item it moved,
    which keeps a vector in both spaces until a cleanup (an item ingested after it keeps one in the
    old space only)."""
    moved = (
        {item.item_id for item in store.items() if item.space == NEW.name}
        if store.backfills.active() is None
        else set()
    )
    for group in ([i for i in changed if i in moved], [i for i in changed if i not in moved]):
        if group:
            given = {OLD.name: np.concatenate([current[i] for i in group])}
            if group[0] in moved:
                given[NEW.name] = psi(given[OLD.name])
            update(store, group, given)


def test_live_writes_while_a_killed_and_resumed_backfill_runs(
    backend: BackendSettings, tmp_path: Path
) -> None:
    from modelupgrade.registry.gates import GateCheck
    from modelupgrade.store.cutover import cleanup, cutover, rollback
    from modelupgrade.store.shadow import ShadowEvaluation

    path = tmp_path / "s"
    with build_gallery(path, N_ITEMS, backend=backend) as store:
        plan_psi_backfill(store, CHUNK)
        versions = {item.item_id: 0 for item in store.items()}
        originals = {
            item.item_id: store.read_vectors(OLD.name, [item.slot]) for item in store.items()
        }
    script = tmp_path / "worker.py"
    script.write_text(slow_backfill_script(CHUNK, job_options="max_group=1"))
    rng = np.random.default_rng(7)
    erased: dict[str, np.ndarray] = {}
    erased_slots: set[int] = set()
    current = dict(originals)
    hold = tmp_path / "hold"
    for round_ in range(3):
        worker = spawn_backfill_worker(path, script, 0.03, hold=hold)
        with GalleryStore.open(path) as store:
            start = len(store.backfills.chunk_log())
            deadline = time.monotonic() + 60
            while len(store.backfills.chunk_log()) == start and time.monotonic() < deadline:
                time.sleep(0.02)
            if milvus_lite(backend):  # one process at a time: the writes follow the kill
                time.sleep(float(rng.uniform(0.0, 0.3)))
                worker.send_signal(signal.SIGKILL)
                worker.wait(timeout=30)
            else:
                # Paused inside ψ of its next chunk while this side writes: where the writes are
                # slow (a Milvus server on a loaded machine) a free-running worker finished the
                # backfill before them (stop 44), and the round tested writes after a backfill.
                hold.touch()
            fresh = [f"live-{round_}-{i}" for i in range(12)]
            vectors = np.concatenate([_vector(i, 0) for i in fresh])
            store.ingest(fresh, vectors, OLD, scores={"old-confidence": np.full(len(fresh), 0.5)})
            current.update({i: _vector(i, 0) for i in fresh})
            versions.update(dict.fromkeys(fresh, 0))
            live = sorted(versions)
            changed = [live[j] for j in rng.choice(len(live), 4, replace=False)]
            for item_id in changed:
                versions[item_id] += 1
                current[item_id] = _vector(item_id, versions[item_id])
            _update(store, changed, current)
            gone = [
                live[j] for j in rng.choice(len(live), 5, replace=False) if live[j] not in changed
            ]
            erased_slots |= {item.slot for item in store.items() if item.item_id in gone}
            erase(store, gone, "asked to be forgotten")
            for item_id in gone:
                erased[item_id] = current.pop(item_id)
                versions.pop(item_id)
            if not milvus_lite(backend):
                hold.unlink()  # released, then killed at a random moment
                time.sleep(float(rng.uniform(0.0, 0.3)))
                worker.send_signal(signal.SIGKILL)
                worker.wait(timeout=30)
            _absent(store, erased, erased_slots)
    worker = spawn_backfill_worker(path, script, 0.0)
    out, err = worker.communicate(timeout=300)
    assert worker.returncode == 0 and out.split()[0] == "complete", err[-3000:]
    with GalleryStore.open(path) as store:
        items = store.items()
        assert sorted(i.item_id for i in items) == sorted(versions)
        assert {i.space for i in items} == {NEW.name}
        slots = np.array([i.slot for i in items])
        stored = store.read_vectors(NEW.name, slots)
        wanted = psi(np.concatenate([current[i.item_id] for i in items]))
        np.testing.assert_allclose(stored, wanted, rtol=1e-5, atol=1e-6)
        assert store.verify_vectors(NEW.name) == len(items)
        _absent(store, erased, erased_slots)
        passed = ShadowEvaluation("mAP", NEW.name, OLD.name, 1, 1, {}, {}, 0.0)
        passed.checks.append(GateCheck("shadow", True, 1.0, 0.0, "test"))
        cutover(store, "go", 168.0, lambda backfill: passed)
        rollback(store, "back")
        assert store.serving_space() == OLD.name
        _absent(store, erased, erased_slots)
        cutover(store, "again", 168.0, lambda backfill: passed)
        cleanup(store, "tidy", force=True)
        _absent(store, erased, erased_slots)


def test_the_erase_and_update_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from modelupgrade.commands.store import store_erase, store_status, store_update

    path = tmp_path / "s"
    build_gallery(path, 40).close()
    code, out, err = command_output(
        capsys,
        store_erase,
        "--store",
        str(path),
        "--item-id",
        "item-00003",
        "item-00004",
        "--reason",
        "GDPR request 17",
        "--json",
    )
    assert code == 0, err
    record = json.loads(out)
    assert (record["items_erased"], record["reason"], record["vectors_destroyed"]) == (
        2,
        "GDPR request 17",
        True,
    )
    assert "item-00003" not in out
    new = np.ones((2, OLD.dim), np.float32)
    np.save(tmp_path / "new.npy", new)
    pd.DataFrame(
        {"item_id": ["item-00005", "item-00006"], "path": ["5b.png", "6b.png"], "index": -1}
    ).to_parquet(tmp_path / "changed.parquet")
    code, out, err = command_output(
        capsys,
        store_update,
        "--store",
        str(path),
        "--items",
        str(tmp_path / "changed.parquet"),
        "--vectors",
        f"{OLD.name}={tmp_path / 'new.npy'}",
        "--json",
    )
    assert code == 0, err
    assert json.loads(out) == {"items_updated": 2, "spaces": [OLD.name], "requeued": 0}
    code, out, err = command_output(capsys, store_status, "--store", str(path), "--json")
    status = json.loads(out)
    assert status["items"] == 38 and status["erasures"] == 1
    with GalleryStore.open(path) as store:
        items = {i.item_id: i for i in store.items()}
        assert "item-00003" not in items and items["item-00005"].source_path == "5b.png"
        np.testing.assert_array_equal(
            store.read_vectors(OLD.name, [items["item-00005"].slot]), new[:1]
        )
    code, _, err = command_output(capsys, store_erase, "--store", str(path), "--reason", " ")
    assert code == 2 and "needs a reason" in err or "name the items" in err


def test_a_writer_of_another_kind_destroys_what_a_killed_erasure_left(tmp_path: Path) -> None:
    """An erasure killed after it recorded the erased slots but before it destroyed their vectors
    leaves them to the next writer, whatever that writer does (here an ingest): the store does not
    wait for another erasure to destroy them."""
    path = tmp_path / "s"
    build_gallery(path, 20).close()
    erasing = (
        "import sys\n"
        "from modelupgrade.store import GalleryStore\n"
        "from modelupgrade.store.live import erase\n"
        "with GalleryStore.open(sys.argv[1]) as store:\n"
        "    erase(store, ['item-00003'], 'a request to be forgotten')\n"
    )
    killed = subprocess.run(
        [sys.executable, "-c", erasing, str(path)],
        check=False,
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT), KILL_ENV: "erase:recorded"},
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL
    with GalleryStore.open(path) as store:
        assert store.db.query("SELECT slot FROM orphan_slots") == [(3,)]
        store.ingest(["item-new"], _vector("item-new", 0), OLD, scores={"old-confidence": [0.5]})
        assert store.db.query("SELECT slot FROM orphan_slots") == []
        assert 3 not in store.vectors.present_slots(OLD).tolist()  # type: ignore[attr-defined]
        assert store.db.query("SELECT destroyed_at IS NOT NULL FROM erasures") == [(1,)]


def _passed_shadow() -> ShadowEvaluation:
    from modelupgrade.registry.gates import GateCheck
    from modelupgrade.store.shadow import ShadowEvaluation

    passed = ShadowEvaluation("mAP", NEW.name, OLD.name, 1, 1, {}, {}, 0.0)
    passed.checks.append(GateCheck("shadow", True, 1.0, 0.0, "test"))
    return passed


def _each_finds_itself(store: GalleryStore) -> None:
    """Every item is served from one space, and a top-1 search with its served vector finds it:
    the backend's part holds every item (its filter is what a search of fewer than the whole part
    reads it by)."""
    from modelupgrade.store import QueryVectors

    snapshot = store.snapshot()
    ((space, positions),) = snapshot.partitions().items()
    served = store.read_vectors(space, snapshot.slots[positions])
    searcher = Searcher(store, build_serving_mode("mixed"), heads=HeadTransforms(forward=psi))
    hits = searcher.search(QueryVectors(served, served), 1)
    assert hits.item_ids[:, 0].tolist() == snapshot.item_ids[positions].tolist()


def _two_backfills_into_new(store: GalleryStore) -> None:
    """Backfill ``store`` into NEW, ingest an item ``late`` into OLD, backfill it too."""
    from tests.store_helpers import psi_job

    psi_job(store, chunk=10).run()
    late = np.ones((1, OLD.dim), np.float32)
    store.ingest(["late"], late, OLD, scores={"old-confidence": np.array([0.5])})
    psi_job(store, chunk=10).run()


def test_a_rollback_after_a_second_backfill_into_the_same_space_serves_every_item_old(
    backend: BackendSettings, tmp_path: Path
) -> None:
    """An item ingested after a complete backfill takes a second backfill into the same space,
    which continues the first one's serving unit. Rolling back must serve the old space for every
    item (the new space is not backward compatible), in the database and in the backend's parts,
    so an item the first backfill moved keeps its old vector live: an update must refresh it there
    too, or the rollback would serve its stale content."""
    from modelupgrade.store.cutover import cutover, rollback
    from modelupgrade.store.verify import verify

    with build_gallery(tmp_path / "s", 40, backend=backend) as store:
        _two_backfills_into_new(store)
        assert [b[0] for b in store.db.query("SELECT unit FROM backfills ORDER BY id")] == [1, 1]
        content = _vector("item-00003", 1)
        update(store, ["item-00003"], {OLD.name: content, NEW.name: psi(content)})
        cutover(store, "go", 168.0, lambda backfill: _passed_shadow())
        step = rollback(store, "back")
        assert step.detail.items_moved == 41
        assert {item.space for item in store.items()} == {OLD.name}
        assert store.read_vectors(OLD.name, np.array([41])).tolist() == content.tolist()
        _each_finds_itself(store)
        assert verify(store).inconsistencies == 0, verify(store).describe()


def test_a_cutover_holds_for_a_later_backfill_of_its_unit_and_a_cleanup_drops_the_old_space(
    tmp_path: Path,
) -> None:
    """A backfill of items ingested after a cut-over one continues its unit: the unit stays cut
    over (the gate passed for the model; the alias points at the new space already), a cleanup
    drops the old space for all of it, and the store verifies whole. After a rollback, a new
    backfill starts a unit of its own and moves every item again."""
    from modelupgrade.store.cutover import cleanup, cutover, rollback
    from modelupgrade.store.verify import verify
    from tests.store_helpers import psi_job

    with build_gallery(tmp_path / "s", 40) as store:
        psi_job(store, chunk=10).run()
        cutover(store, "go", 168.0, lambda backfill: _passed_shadow())
        late = np.ones((1, OLD.dim), np.float32)
        store.ingest(["late"], late, OLD, scores={"old-confidence": np.array([0.5])})
        psi_job(store, chunk=10).run()
        status = store.status()
        assert status.cutover is not None and status.cutover.state == "cut over"
        assert [s.step for s in status.serving_steps] == ["cutover"]
        assert "continues the serving unit of backfill 1" in status.describe()
        rollback(store, "back")
        cutover(store, "again", 168.0, lambda backfill: _passed_shadow())
        assert {item.space for item in store.items()} == {NEW.name}
        cleanup(store, "done", force=True)
        assert verify(store).inconsistencies == 0, verify(store).describe()
        _each_finds_itself(store)

    with build_gallery(tmp_path / "t", 20) as store:
        psi_job(store, chunk=10).run()
        rollback(store, "back")
        assert psi_job(store, chunk=10).run().backfill_id == 2
        assert store.db.query("SELECT id, unit, total FROM backfills ORDER BY id") == [
            (1, 1, 20),
            (2, 2, 20),
        ]
        assert store.status().cutover.state == "awaiting cutover"  # type: ignore[union-attr]


def test_an_abort_of_a_backfill_that_continues_a_unit_undoes_only_its_own_items(
    tmp_path: Path,
) -> None:
    """Aborting the backfill of the items ingested after a complete one returns those items to
    the old space and leaves the earlier backfill, its unit and its steps as they were: a
    rollback still returns every item it moved."""
    from modelupgrade.store.cutover import rollback
    from modelupgrade.store.job import abort_backfill
    from modelupgrade.store.verify import verify
    from tests.store_helpers import psi_job

    with build_gallery(tmp_path / "s", 40) as store:
        psi_job(store, chunk=10).run()
        late = _vector("late", 0)
        store.ingest(["late"], late, OLD, scores={"old-confidence": np.array([0.5])})
        psi_job(store, chunk=10).run(max_chunks=0)
        assert store.db.query("SELECT id, unit, status FROM backfills ORDER BY id") == [
            (1, 1, "complete"),
            (2, 1, "running"),
        ]
        abort_backfill(store)
        assert store.db.query("SELECT id, unit, status FROM backfills") == [(1, 1, "complete")]
        assert store.serving_space() == NEW.name
        spaces = {item.item_id: item.space for item in store.items()}
        assert spaces.pop("late") == OLD.name and set(spaces.values()) == {NEW.name}
        assert rollback(store, "back").detail.items_moved == 40
        assert {item.space for item in store.items()} == {OLD.name}
        assert verify(store).inconsistencies == 0, verify(store).describe()
        _each_finds_itself(store)


def test_a_cutover_refuses_items_ingested_into_the_old_space_after_the_backfill(
    tmp_path: Path,
) -> None:
    """An item ingested into the old space after the backfill completed has no new vector: the
    cutover names it and changes nothing, and a backfill of it lets the cutover through."""
    from modelupgrade.errors import UserError
    from modelupgrade.store.cutover import cutover
    from tests.store_helpers import psi_job

    with build_gallery(tmp_path / "s", 20) as store:
        psi_job(store, chunk=10).run()
        store.ingest(["late"], _vector("late", 0), OLD, scores={"old-confidence": np.array([0.5])})
        with pytest.raises(UserError, match="1 item\\(s\\) have no vector in 'gen1'.*'late'"):
            cutover(store, "go", 168.0, lambda backfill: _passed_shadow())
        assert store.status().serving_steps == []
        psi_job(store, chunk=10).run()
        assert cutover(store, "go", 168.0, lambda backfill: _passed_shadow()).step == "cutover"


def test_no_item_lands_in_a_space_the_serving_one_cannot_search(tmp_path: Path) -> None:
    """Old queries cannot meet a later model's vectors: with no backfill running, an ingest into
    a space the serving one does not upgrade from is refused; a rollback that would leave items
    ingested into the new space with no old vector is refused, and changes nothing; a store an
    older modelupgrade left that way answers a search with that, not a numpy error."""
    import sqlite3

    from modelupgrade.errors import UserError
    from modelupgrade.store import QueryVectors
    from modelupgrade.store.cutover import rollback
    from tests.store_helpers import psi_job

    late = psi(_vector("late", 0))
    with build_gallery(tmp_path / "s", 20) as store:
        with pytest.raises(UserError, match="serves space 'gen0', which cannot search items in"):
            store.ingest(["late"], late, NEW, scores={"old-confidence": np.array([0.5])})
        assert store.item_count() == 20 and set(store.spaces()) == {OLD.name}
        psi_job(store, chunk=10).run()
        store.ingest(["late"], late, NEW, scores={"old-confidence": np.array([0.5])})
        with pytest.raises(UserError, match="1 item\\(s\\) were ingested into 'gen1' after"):
            rollback(store, "back")
        assert store.serving_space() == NEW.name and store.status().serving_steps == []
    with sqlite3.connect(tmp_path / "s" / "store.sqlite") as db:  # what a rollback once did
        db.execute("UPDATE items SET space = 'gen0' WHERE backfill_id IS NOT NULL")
        db.execute("UPDATE meta SET value = 'gen0' WHERE key = 'serving_space'")
        db.execute("UPDATE meta SET value = value + 1 WHERE key = 'items_epoch'")
    with GalleryStore.open(tmp_path / "s") as store:
        searcher = Searcher(store, build_serving_mode("mixed"), heads=HeadTransforms(forward=psi))
        query = _vector("q", 0)
        with pytest.raises(UserError, match="1 item\\(s\\) are in space 'gen1', which the serving"):
            searcher.search(QueryVectors(query, query), 3)


def test_an_update_while_a_backfill_continues_a_unit_refreshes_both_vectors_of_an_earlier_item(
    tmp_path: Path,
) -> None:
    """While the backfill of late items runs, an item the unit's first backfill moved keeps its old
    vector for a rollback: an update must give both, and the rollback serves the new content."""
    from modelupgrade.errors import UserError
    from modelupgrade.store.cutover import cutover, rollback
    from tests.store_helpers import psi_job

    with build_gallery(tmp_path / "s", 40) as store:
        psi_job(store, chunk=10).run()
        store.ingest(["late"], _vector("late", 0), OLD, scores={"old-confidence": np.array([0.5])})
        psi_job(store, chunk=10).run(max_chunks=0)
        content = _vector("item-00003", 1)
        with pytest.raises(UserError, match="its vectors in \\['gen0'\\] are missing"):
            update(store, ["item-00003"], {NEW.name: psi(content)})
        update(store, ["item-00003"], {OLD.name: content, NEW.name: psi(content)})
        psi_job(store, chunk=10).run()
        cutover(store, "go", 168.0, lambda backfill: _passed_shadow())
        rollback(store, "back")
        slot = next(item.slot for item in store.items() if item.item_id == "item-00003")
        np.testing.assert_array_equal(store.read_vectors(OLD.name, np.array([slot])), content)
        _each_finds_itself(store)
