"""Writers of a store (issue 20, items 1, 2, 3 and 5): one at a time, each checked before it changes
anything, undone with ``backfill --abort``, and an exit code that says how it ended.

A second writer meets the lock of a backfill running in a subprocess and is told who holds it; a
killed writer's lock is taken over. A backfill whose model, head or images cannot work, or whose new
space the serving mode cannot serve, is refused with the store as it was. A backfill with failed
items is not "complete" and exits 1; one stopped by SIGTERM exits 143.

Every test of a store runs on each backend (the ``backend`` fixture: embedded, Milvus Lite). Milvus
Lite serves one process at a time, so while a backfill process runs, another process can read the
store's ledger (and is refused as a writer) but not its vectors: there, the readers' part of the
second-writer test checks that the vectors refuse it in one clear line instead.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from modelupgrade.cli.arguments import run_command
from modelupgrade.commands.store import backfill as backfill_command
from modelupgrade.errors import EXIT_INCOMPLETE, EXIT_STOPPED, UserError
from modelupgrade.heads import build_head, save_head
from modelupgrade.models import save_model
from modelupgrade.ordering import build_ordering
from modelupgrade.serving import build_serving_mode
from modelupgrade.store import (
    BackendSettings,
    BackfillJob,
    GalleryStore,
    HeadTransforms,
    ImageFileSource,
    ReEmbedImages,
    Searcher,
    ServingCheck,
    SpaceSpec,
    TransformStored,
    abort_backfill,
)
from modelupgrade.store.ledger import AbortRecord
from modelupgrade.store.lock import HOLDER_FILE, LockHolder, WriterLock, pid_alive
from tests.model_fixtures import tiny_model
from tests.store_helpers import (
    NEW,
    OLD,
    build_gallery,
    command_output,
    exit_code_and_output,
    image_gallery,
    ingest_skipping_an_image,
    milvus_lite,
    milvus_lite_held,
    psi,
    psi_job,
    reverse,
    spawn_backfill_worker,
    stored_spaces,
    wait_for_chunks,
)

CHUNK = 16

# A backfill run through the command-line runner, with a ψ slow enough to meet it while it runs.
SLOW_BACKFILL = textwrap.dedent(
    '''
    import sys, time
    from modelupgrade.cli.arguments import run_command
    from modelupgrade.ordering import build_ordering
    from modelupgrade.store import BackfillJob, BackfillReport, GalleryStore, TransformStored
    from tests.store_helpers import NEW, psi

    def slow_psi(vectors):
        time.sleep(float(sys.argv[2]))
        return psi(vectors)

    def backfill_slowly() -> BackfillReport:
        """Backfill the store with a slow ψ."""
        with GalleryStore.open(sys.argv[1]) as store:
            return BackfillJob(
                store, NEW, TransformStored(slow_psi), build_ordering("old-confidence"), {chunk},
                progress=False,
            ).run()

    run_command(backfill_slowly, ["--json"])
    '''
).format(chunk=CHUNK)


def _spawn(store: Path, tmp_path: Path, delay: float) -> subprocess.Popen[str]:
    script = tmp_path / "slow_backfill.py"
    script.write_text(SLOW_BACKFILL)
    return spawn_backfill_worker(store, script, delay)


def _store(tmp_path: Path, backend: BackendSettings, n: int, images: bool = False) -> Path:
    """A store of ``n`` items on ``backend`` at ``tmp_path``/s, closed: ``build_gallery``'s, or
    with ``images`` ``image_gallery``'s."""
    path = tmp_path / "s"
    (image_gallery if images else build_gallery)(path, n, backend=backend).close()
    return path


def _backfill_running(
    tmp_path: Path, backend: BackendSettings, chunks: int
) -> tuple[Path, subprocess.Popen[str]]:
    """A store of 400 items and the slow backfill of it running in a subprocess (``_spawn``), once
    that has committed ``chunks`` chunks."""
    path = _store(tmp_path, backend, 400)
    process = _spawn(path, tmp_path, delay=0.05)
    try:
        with GalleryStore.open(path) as watcher:
            wait_for_chunks(watcher, process, chunks)
    except BaseException:
        process.kill()
        process.communicate(timeout=60)
        raise
    return path, process


def _refused_backfill(capsys: pytest.CaptureFixture[str], path: Path, *argv: str) -> str:
    """The error of the backfill command on the store at ``path`` with ``argv``, which it must
    refuse (exit code 2) and leave as before any backfill."""
    code, _, err = command_output(capsys, backfill_command, "--store", str(path), *argv)
    assert code == 2, err
    with GalleryStore.open(path) as store:
        _assert_as_before_any_backfill(store)
    return err


def _assert_as_before_any_backfill(store: GalleryStore) -> None:
    """Every item in gen0 and idle, gen0 serving, no backfill, no gen1 space or vectors."""
    status = store.status()
    assert status.serving_space == "gen0"
    assert status.backfill is None and store.backfills.active() is None
    assert status.items_by_space == {"gen0": status.items}
    assert status.items_by_state == {"idle": status.items}
    assert set(store.spaces()) == {"gen0"}
    assert stored_spaces(store) == {"gen0"}


def _bict_head(directory: Path, in_dim: int, out_dim: int) -> Path:
    torch.manual_seed(0)
    save_head(build_head("bict", in_dim, out_dim, hidden_dim=8, depth=2), directory)
    return directory


def _checked_psi_job(store: GalleryStore, serving: ServingCheck) -> BackfillJob:
    """A backfill into ``NEW`` by ψ in ingest order, chunks of 10, checked with ``serving``."""
    return BackfillJob(
        store,
        NEW,
        TransformStored(psi),
        build_ordering("ingest-order"),
        10,
        progress=False,
        serving=serving,
    )


def _gen1_model(directory: Path) -> Path:
    """An untrained generation-1 model of ``NEW``'s dimension, saved in ``directory``."""
    save_model(tiny_model(NEW.dim).eval(), directory, {"generation": 1})
    return directory


# ----- 1. one writer per store --------------------------------------------------------------------
def test_the_lock_is_reentrant_for_its_holder_and_exclusive_for_any_other(tmp_path: Path) -> None:
    first, second = WriterLock(tmp_path), WriterLock(tmp_path)
    with first.hold("backfill into 'gen1'"):
        with first.hold("ingest"):
            assert json.loads((tmp_path / HOLDER_FILE).read_text())["pid"] == os.getpid()
        assert first.held
        with pytest.raises(UserError, match=rf"by pid {os.getpid()} \(backfill into 'gen1'"):
            second.acquire("ingest")
    assert not first.held and not (tmp_path / HOLDER_FILE).exists()
    with second.hold("ingest"):
        assert second.held


def test_a_second_writer_is_refused_naming_the_holder_while_readers_go_on(
    tmp_path: Path, backend: BackendSettings
) -> None:
    path, process = _backfill_running(tmp_path, backend, 1)
    try:
        with GalleryStore.open(path) as store:
            # The corruption: a second backfill into the same space with another model.
            other = BackfillJob(
                store,
                NEW,
                TransformStored(lambda v: -psi(v)),
                build_ordering("old-confidence"),
                CHUNK,
                progress=False,
            )
            holder = rf"being written by pid {process.pid} \(backfill into 'gen1': `.*`\), since "
            with pytest.raises(UserError, match=holder) as refused:
                other.run()
            assert f"kill -TERM {process.pid}" in str(refused.value.hint)
            # An ingest is a live write: it goes on during the backfill, between its commits, and
            # joins it (issue 29); only Milvus Lite, held by the backfilling process, refuses it.
            newcomer = np.ones((1, OLD.dim), np.float32)
            if milvus_lite(backend):
                with pytest.raises(UserError, match="Milvus Lite serves one process at a time"):
                    store.ingest(["new"], newcomer, OLD, scores={"old-confidence": np.ones(1)})
            else:
                store.ingest(["new"], newcomer, OLD, scores={"old-confidence": np.ones(1)})
                joined = {s["item_id"]: s for s in store.backfills.item_states()}["new"]
                assert (joined["space"], joined["state"]) == ("gen0", "pending")
            with pytest.raises(UserError, match=rf"cannot abort the backfill: .* {process.pid}"):
                abort_backfill(store)
            # Readers never take the lock.
            assert store.status().backfill.status == "running"
            searcher = Searcher(
                store, build_serving_mode("rank-merge-rqt"), heads=HeadTransforms(reverse=reverse)
            )
            query = np.ones((1, NEW.dim), np.float32)
            if milvus_lite(backend):
                # Milvus Lite's documented limit: the backfilling process holds the Lite file.
                with pytest.raises(UserError, match="Milvus Lite serves one process at a time"):
                    searcher.search(query, 5)
            else:
                assert len(set(searcher.search(query, 5).item_ids[0])) == 5
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    with GalleryStore.open(path) as store:
        done = np.array([s["slot"] for s in store.backfills.item_states() if s["state"] == "done"])
        assert len(done) >= CHUNK
        # Every committed vector is the first writer's.
        np.testing.assert_allclose(
            store.read_vectors("gen1", done),
            psi(store.read_vectors("gen0", done)),
            rtol=1e-5,
            atol=1e-6,
        )
        assert psi_job(store, chunk=CHUNK).run().status == "complete"


def test_the_lock_of_a_killed_writer_is_taken_over(
    tmp_path: Path, backend: BackendSettings, caplog: pytest.LogCaptureFixture
) -> None:
    path, process = _backfill_running(tmp_path, backend, 1)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    record = LockHolder.read(path / HOLDER_FILE)
    assert record is not None and record.on_this_host
    assert (record.pid, record.operation) == (process.pid, "backfill into 'gen1'")
    assert not pid_alive(process.pid)
    with GalleryStore.open(path) as store, caplog.at_level(logging.WARNING):
        assert psi_job(store, chunk=CHUNK).run().status == "complete"
    assert f"pid {process.pid}" in caplog.text and "taking it over" in caplog.text
    assert not (path / HOLDER_FILE).exists()


# ----- 2. checked before anything changes; --abort ----------------------------------------------
def test_a_head_that_does_not_take_the_store_s_vectors_is_refused_before_anything_changes(
    tmp_path: Path, backend: BackendSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _store(tmp_path, backend, 60)
    wide = _bict_head(tmp_path / "wide", 32, NEW.dim)
    options = ["--space", "gen1", "--no-progress"]
    err = _refused_backfill(capsys, path, *options, "--transform-head", str(wide))
    assert "takes 32-d vectors, but the store's vectors to backfill (space 'gen0') are 16-d" in err
    assert "nothing was changed" in err and "Traceback" not in err
    fitting = _bict_head(tmp_path / "fitting", OLD.dim, NEW.dim)
    code, out, err = command_output(
        capsys,
        backfill_command,
        "--store",
        str(path),
        *options,
        "--transform-head",
        str(fitting),
        "--json",
    )
    assert code == 0, err
    assert json.loads(out)["status"] == "complete"


def test_a_vector_source_that_fails_on_a_sample_is_refused_before_the_plan(
    tmp_path: Path, backend: BackendSettings
) -> None:
    (tmp_path / "no-images").mkdir()
    with image_gallery(tmp_path / "s", 40, backend=backend) as store:
        sources = (
            (TransformStored(lambda v: v[:, :5]), "5-d vectors, but space 'gen1' holds 12-d"),
            (
                TransformStored(lambda v: v @ np.ones((32, NEW.dim))),
                "fails on 16 of the items to move: ValueError",
            ),
            (
                ReEmbedImages(ImageFileSource(tmp_path / "no-images"), lambda x: x),
                r"none of 16 items sampled .* could be computed, e.g. image file .* does not exist",
            ),
        )
        for source, refusal in sources:
            job = BackfillJob(store, NEW, source, build_ordering("ingest-order"), 8, progress=False)
            with pytest.raises(UserError, match=refusal) as refused:
                job.run()
            assert "nothing was changed" in refused.value.message
            _assert_as_before_any_backfill(store)


def test_abort_returns_the_store_to_its_state_before_the_backfill(
    tmp_path: Path, backend: BackendSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s"
    with build_gallery(path, 100, backend=backend) as store:
        stored = store.read_vectors("gen0", np.arange(100))
        assert psi_job(store, chunk=20).run(max_chunks=2).status == "paused"
        assert store.serving_space() == "gen1"
    code, _, err = command_output(
        capsys, backfill_command, "--store", str(path), "--abort", "--model", "m"
    )
    assert code == 2 and "--abort undoes the running backfill; it takes no --model" in err
    code, out, err = command_output(
        capsys, backfill_command, "--store", str(path), "--abort", "--json"
    )
    assert code == 0, err
    undone = json.loads(out)
    assert (undone["items_moved_back"], undone["serving_space"]) == (40, "gen0")
    assert undone["target_space_dropped"]
    with GalleryStore.open(path) as store:
        _assert_as_before_any_backfill(store)
        np.testing.assert_array_equal(store.read_vectors("gen0", np.arange(100)), stored)
        assert store.backfills.last_aborted() == AbortRecord(**undone)
        hits = Searcher(store, build_serving_mode("mixed")).search(stored[:3], 1)
        assert hits.item_ids[:, 0].tolist() == ["item-00000", "item-00001", "item-00002"]
        # Free for another backfill, even into a space of the same name and another size.
        smaller = SpaceSpec("gen1", 8, upgrades_from=("gen0",), backward_compatible=True)
        job = BackfillJob(
            store,
            smaller,
            TransformStored(lambda v: v[:, :8]),
            build_ordering("random"),
            30,
            progress=False,
        )
        assert job.run().status == "complete"
        assert store.status().items_by_space == {"gen1": 100}
    code, _, err = command_output(capsys, backfill_command, "--store", str(path), "--abort")
    assert code == 2 and "nothing to abort" in err


def test_an_abort_that_cannot_reach_milvus_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Milvus Lite file held by another process (a service, say: Milvus Lite serves one process
    at a time): the abort is refused in one line before the ledger changes, not recorded and then
    left with the target's collection undeleted behind an error."""
    pytest.importorskip("milvus_lite")
    monkeypatch.setenv("MODELUPGRADE_LOG_LEVEL", "WARNING")  # stderr: the error alone
    path = tmp_path / "s"
    with build_gallery(path, 60, backend=BackendSettings(kind="milvus")) as store:
        assert psi_job(store, chunk=20).run(max_chunks=1).status == "paused"
    with milvus_lite_held(path):
        code, _, err = command_output(capsys, backfill_command, "--store", str(path), "--abort")
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 2, err  # no traceback logged by Milvus Lite before the error
    assert lines[0].startswith("error: cannot open the Milvus Lite file")
    assert "another process holds the lock" in lines[0]
    assert "one process at a time" in lines[1]
    with GalleryStore.open(path) as store:
        status = store.status()
        assert (status.serving_space, status.backfill.status) == ("gen1", "running")
        assert stored_spaces(store) == {"gen0", "gen1"}
    code, _, err = command_output(capsys, backfill_command, "--store", str(path), "--abort")
    assert code == 0, err
    with GalleryStore.open(path) as store:
        _assert_as_before_any_backfill(store)


# ----- 3. exit codes that tell the truth -------------------------------------------------------
def test_a_backfill_with_failed_items_is_not_complete_and_exits_1(
    tmp_path: Path, backend: BackendSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _store(tmp_path, backend, 60)
    vectors = np.random.default_rng(3).normal(size=(60, NEW.dim)).astype(np.float32)
    ids = [f"item-{i:05d}" for i in range(60)]
    missing = {5, 30, 31}
    table, items = tmp_path / "new.npy", tmp_path / "new.parquet"
    pd.DataFrame({"item_id": [i for n, i in enumerate(ids) if n not in missing]}).to_parquet(items)
    np.save(table, np.delete(vectors, sorted(missing), axis=0))
    arguments = [
        *("--store", str(path), "--space", "gen1", "--chunk-size", "10", "--no-progress"),
        *("--vectors", str(table), "--items", str(items), "--json"),
    ]
    code, out, err = command_output(capsys, backfill_command, *arguments)
    assert code == EXIT_INCOMPLETE == 1, err
    assert "Traceback" not in err and " ERROR " not in err, err  # only the command's own error
    assert "error: 3 item(s) failed and are still served from space 'gen0'" in err
    assert f"`modelupgrade store-status --store {path}` lists them" in err
    assert "--retry-failed" in err and "--abort" in err
    assert json.loads(out)["status"] == "incomplete"
    with GalleryStore.open(path) as store:
        status = store.status()
        assert status.backfill.status == "running" and status.backfill.failed == 3
        assert sorted(f.item_id for f in status.failed) == [ids[n] for n in sorted(missing)]
    # The table completed, the failed items retried: complete, exit 0.
    pd.DataFrame({"item_id": ids}).to_parquet(items)
    np.save(table, vectors)
    code, out, err = command_output(capsys, backfill_command, *arguments, "--retry-failed")
    assert code == 0, err
    assert json.loads(out)["status"] == "complete"
    with GalleryStore.open(path) as store:
        assert store.status().backfill.status == "complete"
        np.testing.assert_array_equal(store.read_vectors("gen1", np.arange(60)), vectors)


def test_a_backfill_stopped_by_sigterm_exits_143_and_says_how_to_resume(
    tmp_path: Path, backend: BackendSettings
) -> None:
    _, process = _backfill_running(tmp_path, backend, 2)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == EXIT_STOPPED == 143, err
    assert "error: backfill 1 into 'gen1' was stopped (SIGTERM) at a chunk boundary" in err
    assert "run the same command again to resume" in err
    assert json.loads(out)["status"] == "stopped"


# ----- 5. a model the serving mode cannot serve ------------------------------------------------
def test_a_model_the_serving_mode_cannot_serve_meanwhile_is_refused_up_front(
    tmp_path: Path, backend: BackendSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _store(tmp_path, backend, 30)
    independent = _gen1_model(tmp_path / "gen1-independent")
    # params.yaml serves in mixed mode, which compares new queries with the stored old vectors.
    err = _refused_backfill(capsys, path, "--model", str(independent))
    assert (
        "model 'gen1-independent' is not backward compatible with the store's space 'gen0'" in err
    )
    assert "serving mode 'mixed'" in err and "nothing was changed" in err
    assert "serve with rank-merge or rank-merge-rqt while it runs" in err
    assert "--mode rank-merge" in err and "--forward-head" in err
    with GalleryStore.open(path) as store:
        for check in (
            ServingCheck(build_serving_mode("rank-merge")),
            ServingCheck(build_serving_mode("rank-merge-rqt")),
            ServingCheck(build_serving_mode("mixed"), forward_head=True),
        ):
            assert _checked_psi_job(store, check).run(max_chunks=1).status == "paused"
            abort_backfill(store)
        full = _checked_psi_job(store, ServingCheck(build_serving_mode("rank-merge-full")))
        with pytest.raises(UserError, match="'rank-merge-full' cannot search space 'gen1'"):
            full.run()
        _assert_as_before_any_backfill(store)


def test_images_that_cannot_be_read_at_all_stop_the_command_before_it_plans(
    tmp_path: Path, backend: BackendSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _store(tmp_path, backend, 24, images=True)
    model = _gen1_model(tmp_path / "gen1")
    # params.yaml's dataset root holds none of these items' files.
    err = _refused_backfill(capsys, path, "--model", str(model), "--mode", "rank-merge")
    assert "none of 16 items sampled across the ones to move could be computed" in err
    assert "dataset.root" in err


def test_an_ingest_that_skipped_items_exits_1_with_a_count(
    tmp_path: Path, backend: BackendSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    from modelupgrade.commands.store import store_ingest

    argv = [*ingest_skipping_an_image(tmp_path, backend), "--json"]
    code, out, err = exit_code_and_output(capsys, lambda: run_command(store_ingest, argv))
    assert code == EXIT_INCOMPLETE, err
    assert "error: 1 item(s) were skipped and are not in the store, e.g. it4" in err
    report = json.loads(out)
    assert report["items"] == 5 and [s["item_id"] for s in report["skipped"]] == ["it4"]
    assert report["vectors"]["backend"] == backend.kind
    with GalleryStore.open(tmp_path / "s") as store:
        assert store.item_count() == 5 and stored_spaces(store) == {"gen0"}
