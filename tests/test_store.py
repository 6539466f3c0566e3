"""Gallery store: ingest, ordering, serving modes, bad input, the CLI commands."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from modelupgrade.commands.store import search as search_command
from modelupgrade.errors import UserError
from modelupgrade.ordering import build_ordering
from modelupgrade.retrieval import DistanceBlock
from modelupgrade.serving import build_serving_mode
from modelupgrade.store import (
    SCHEMA_VERSION,
    BackfillJob,
    ChunkCommit,
    GalleryStore,
    HeadTransforms,
    ImageFileSource,
    QueryVectors,
    ReEmbedImages,
    Searcher,
    SpaceSpec,
    TransformStored,
    start_or_resume,
)
from tests.store_helpers import (
    NEW,
    OLD,
    build_gallery,
    command_output,
    image_gallery,
    psi,
    reverse,
    write_images,
)
from tests.store_helpers import psi_job as _job


# ----- ingest and schema --------------------------------------------------------------------------
def test_ingest_then_reopen_keeps_items_vectors_and_scores(tmp_path: Path) -> None:
    vectors = np.random.default_rng(0).normal(size=(50, OLD.dim)).astype(np.float32)
    with GalleryStore.create(tmp_path / "s") as store:
        store.ingest(
            [f"a{i}" for i in range(30)], vectors[:30], OLD, scores={"old-entropy": np.arange(30.0)}
        )
        store.ingest(
            [f"a{i}" for i in range(30, 50)],
            vectors[30:],
            OLD,
            scores={"old-entropy": np.arange(30.0, 50.0)},
        )
    with GalleryStore.open(tmp_path / "s") as store:
        np.testing.assert_array_equal(store.read_vectors("gen0", np.arange(50)), vectors)
        assert store.scores("old-entropy", np.arange(50)).tolist() == list(np.arange(50.0))
        assert (
            list(store.score_kinds()) == ["old-entropy"]
            and "entropy" in store.score_kinds()["old-entropy"]
        )
        assert store.status().serving_space == "gen0"


def test_the_store_records_what_its_scores_mean_and_refuses_a_policy_whose_score_it_lacks(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(0)
    with GalleryStore.create(tmp_path / "s") as store:
        store.ingest(
            [f"a{i}" for i in range(10)],
            rng.normal(size=(10, OLD.dim)),
            OLD,
            scores={"old-confidence": rng.random(10)},
        )
        # Backfilling by entropy must not read the confidence values as if they were entropies.
        with pytest.raises(UserError, match="holds no 'old-entropy' scores") as refused:
            _job(store, "old-entropy").run()
        assert "--score old-entropy" in refused.value.hint
        assert store.backfills.active() is None and "gen1" not in store.spaces()
        with pytest.raises(UserError, match="carries the scores"):
            store.ingest(
                ["b"], rng.normal(size=(1, OLD.dim)), OLD, scores={"old-entropy": np.ones(1)}
            )
        with pytest.raises(UserError, match="new vector"):
            store.ingest(
                ["c"], rng.normal(size=(1, OLD.dim)), OLD, scores={"alignment-error": np.ones(1)}
            )
        with pytest.raises(UserError, match="unknown ordering score"):
            store.ingest(["d"], rng.normal(size=(1, OLD.dim)), OLD, scores={"bogus": np.ones(1)})
        assert store.item_count() == 10


def test_the_plan_is_the_shared_policy_order_of_the_items_by_slot(tmp_path: Path) -> None:
    for policy, seed in (("random", 11), ("old-confidence", 0), ("ingest-order", 0)):
        with build_gallery(tmp_path / policy, 37) as store:
            backfill = start_or_resume(store, NEW, "transform", build_ordering(policy), 5, seed)
            planned = [c.slots.tolist() for c in store.backfills.next_chunks(backfill, limit=None)]
            scores = store.scores("old-confidence", np.arange(37))
            expected = build_ordering(policy).order(
                37, scores if policy == "old-confidence" else None, seed
            )
            assert [slot for chunk in planned for slot in chunk] == expected.tolist()
            assert store.status().backfill.seed == seed


def test_bad_ingest_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    with GalleryStore.create(tmp_path / "s") as store:
        with pytest.raises(UserError, match="dimension 15, but space 'gen0' holds 16-d"):
            store.ingest(["a", "b"], np.zeros((2, 15)), OLD)
        store.ingest(["a", "b"], np.zeros((2, 16)), OLD)
        with pytest.raises(UserError, match="already in the store"):
            store.ingest(["b", "c"], np.zeros((2, 16)), OLD)
        with pytest.raises(UserError, match="dimension 16"):
            store.ingest(["x"], np.zeros((1, 16)), SpaceSpec("gen0", 8))
        with pytest.raises(UserError, match="NaN"):
            store.ingest(["n"], np.full((1, 16), np.nan), OLD)
        assert store.item_count() == 2


def test_a_store_of_another_schema_version_is_refused(tmp_path: Path) -> None:
    build_gallery(tmp_path / "s", 10).close()
    with sqlite3.connect(tmp_path / "s" / "store.sqlite") as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(
        UserError, match=f"schema version 99, this modelupgrade reads version {SCHEMA_VERSION}"
    ):
        GalleryStore.open(tmp_path / "s")
    with pytest.raises(UserError, match="no gallery store"):
        GalleryStore.open(tmp_path / "nowhere")


# ----- backfill -----------------------------------------------------------------------------------
def test_backfill_follows_the_policy_order_chunk_by_chunk(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", 100) as store:
        scores = store.scores("old-confidence", np.arange(100))
        report = _job(store, "old-confidence", chunk=30).run(max_chunks=1)
        assert report.status == "paused" and report.items_written == 30
        done = [s["slot"] for s in store.backfills.item_states() if s["state"] == "done"]
        assert sorted(done) == sorted(np.argsort(scores)[:30].tolist())  # lowest confidence first
        assert _job(store, chunk=30).run().status == "complete"
        assert [c["items"] for c in store.backfills.chunk_log()] == [30, 30, 30, 10]
        # chunks of 30 and one batch of 100 take different BLAS blockings: equal to float32
        # rounding, not bitwise
        np.testing.assert_allclose(
            store.read_vectors("gen1", np.arange(100)),
            psi(store.read_vectors("gen0", np.arange(100))),
            rtol=1e-5,
            atol=1e-6,
        )
        assert store.status().items_by_space == {"gen1": 100}


def test_the_totals_of_a_backfill_run_in_parts_are_the_stores(tmp_path: Path) -> None:
    from modelupgrade.store import BackfillReport

    with build_gallery(tmp_path / "s", 100) as store:
        first = _job(store, chunk=30).run(max_chunks=2)
        last = _job(store, chunk=30).run()
        # Each run reports its own chunks; the backfill's totals cover both runs.
        assert (first.items_written, last.items_written) == (60, 40)
        whole = BackfillReport.whole_backfill(store.status(), last.status)
        assert (whole.status, whole.target_space, whole.backfill_id) == ("complete", "gen1", 1)
        assert (whole.items_written, whole.items_failed, whole.chunks_committed) == (100, 0, 4)
        backfill = store.status().backfill
        assert whole.seconds == pytest.approx(backfill.finished_at - backfill.started_at)
        assert whole.items_per_second == pytest.approx(100 / whole.seconds)


def test_chunks_computed_during_a_slow_commit_are_committed_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with build_gallery(tmp_path / "s", 100) as store:
        groups: list[list[int]] = []
        real_commit = store.backfills.commit_chunks

        def slow_commit(space, commits):  # type: ignore[no-untyped-def]
            groups.append([c.chunk.index for c in commits])
            time.sleep(0.2)  # a sync far slower than ψ: the next chunks finish meanwhile
            real_commit(space, commits)

        monkeypatch.setattr(store.backfills, "commit_chunks", slow_commit)
        assert _job(store, chunk=10).run().status == "complete"
        # every chunk once, in order
        assert [i for group in groups for i in group] == list(range(10))
        assert len(groups) < 10 and max(map(len, groups)) > 1
        # one row per chunk
        assert [c["chunk"] for c in store.backfills.chunk_log()] == list(range(10))
        assert store.status().items_by_space == {"gen1": 100}


def test_a_group_commit_is_all_or_nothing(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", 40) as store:
        backfill = start_or_resume(store, NEW, "transform", build_ordering("old-confidence"), 10)
        first, second = store.backfills.next_chunks(backfill, limit=2)
        vectors = psi(store.read_vectors("gen0", first.slots))
        store.write_vectors("gen1", first.slots, vectors)
        store.backfills.commit_chunks("gen1", [ChunkCommit(first, first.slots, {}, "digest")])
        group = [
            ChunkCommit(second, second.slots, {}, "digest"),
            ChunkCommit(first, first.slots, {}, "digest"),
        ]
        with pytest.raises(RuntimeError, match="already committed"):
            store.backfills.commit_chunks("gen1", group)
        # the second rolled back with the first
        assert [c["chunk"] for c in store.backfills.chunk_log()] == [0]
        assert store.backfills.next_chunks(backfill)[0].index == 1


def test_an_incompatible_generation_is_refused(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", 20) as store:
        gen2 = SpaceSpec("gen2", 12, upgrades_from=("gen1",))
        with pytest.raises(UserError, match="upgrades from gen1"):
            _job(store, target=gen2).run()
        assert store.backfills.active() is None
        _job(store, chunk=8).run(max_chunks=1)
        with pytest.raises(UserError, match="still running"):
            _job(store, target=SpaceSpec("gen1b", 12, upgrades_from=("gen0",))).run()
        with pytest.raises(UserError, match="dimension"):
            store.add_space(SpaceSpec("gen1", 10, upgrades_from=("gen0",)))


def test_a_model_of_the_wrong_dimension_stops_the_job_before_any_commit(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", 20) as store:
        wrong = BackfillJob(
            store,
            NEW,
            TransformStored(lambda v: v[:, :5]),
            build_ordering("ingest-order"),
            8,
            progress=False,
        )
        with pytest.raises(UserError, match="5-d vectors, but space 'gen1' holds 12-d"):
            wrong.run()
        # refused on a sample before the plan: nothing changed
        assert store.status().backfill is None and "gen1" not in store.spaces()


def _image_gallery(tmp_path: Path, n: int, corrupt: set[int]) -> tuple[GalleryStore, Path]:
    root = write_images(tmp_path / "images", n, 8, corrupt)
    return image_gallery(tmp_path / "s", n), root


def _embed(images: np.ndarray) -> np.ndarray:
    flat = images.reshape(len(images), -1).astype(np.float32) / 255.0
    return flat[:, : NEW.dim] - 0.5


def test_a_corrupt_image_is_logged_skipped_listed_and_served_from_the_old_space(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, root = _image_gallery(tmp_path, 40, corrupt={17})
    with store:
        job = BackfillJob(
            store,
            NEW,
            ReEmbedImages(ImageFileSource(root), _embed),
            build_ordering("ingest-order"),
            10,
            progress=False,
        )
        report = job.run()
        # not complete while an item is not in the target space
        assert (report.status, report.exit_code) == ("incomplete", 1)
        assert [f.item_id for f in report.failed] == ["img17"]
        assert "cannot decode" in report.failed[0].reason
        assert "img17" in caplog.text
        states = {s["item_id"]: s for s in store.backfills.item_states()}
        assert states["img17"]["state"] == "failed" and states["img17"]["space"] == "gen0"
        assert sum(s["state"] == "done" for s in states.values()) == 39
        log = store.backfills.chunk_log()
        assert log[1]["failed"] == 1 and log[1]["written"] == 9
        hits = Searcher(
            store, build_serving_mode("rank-merge-rqt"), heads=HeadTransforms(reverse=reverse)
        ).search(np.zeros((1, NEW.dim), np.float32) + 0.1, k=40)
        assert "img17" in set(hits.item_ids[0])  # never silently dropped from the gallery
        with pytest.raises(UserError, match="backfill into space 'gen1' is still running"):
            _job(store, target=SpaceSpec("gen2", 12, upgrades_from=("gen1",))).run()
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / "17.png")
        store.backfills.retry_failed()
        retried = job.run()
        assert retried.status == "complete" and retried.items_written == 1 and not retried.failed
        assert store.status().items_by_space == {"gen1": 40}


# ----- serving ------------------------------------------------------------------------------------
def _distance(query: np.ndarray, vector: np.ndarray) -> float:
    return float(DistanceBlock(query[None], vector[None], "cosine")()[0, 0])


def _brute_force_rank_merge(
    store: GalleryStore, query: np.ndarray, old_query: np.ndarray | None, k: int
) -> list[str]:
    """Seo et al.'s merge, item by item: the old part searched by ``old_query`` (ψ_rev(query) when
    None), the new part by ``query``; ties to the new part, then the lower slot."""
    scored = []
    for s in store.backfills.item_states():
        slot = np.array([s["slot"]])
        if s["space"] == "gen1":
            d = _distance(query, store.read_vectors("gen1", slot)[0])
        else:
            d = _distance(
                reverse(query[None])[0] if old_query is None else old_query,
                store.read_vectors("gen0", slot)[0],
            )
        scored.append((d, s["space"] != "gen1", s["slot"], s["item_id"]))
    return [item for *_, item in sorted(scored)[:k]]


def test_rank_merge_searches_the_old_part_with_the_old_query_and_names_spaces(
    tmp_path: Path,
) -> None:
    with build_gallery(tmp_path / "s", 120) as store:
        _job(store, chunk=20).run(max_chunks=3)
        rng = np.random.default_rng(5)
        query, old_query = (
            rng.normal(size=NEW.dim).astype(np.float32),
            rng.normal(size=OLD.dim).astype(np.float32),
        )
        hits = Searcher(store, build_serving_mode("rank-merge")).search(
            QueryVectors(query, old_query), 15
        )
        assert hits.item_ids[0].tolist() == _brute_force_rank_merge(store, query, old_query, 15)
        space_of = {s["item_id"]: s["space"] for s in store.backfills.item_states()}
        assert [space_of[i] for i in hits.item_ids[0]] == hits.spaces[0].tolist()
        rqt = Searcher(
            store, build_serving_mode("rank-merge-rqt"), heads=HeadTransforms(reverse=reverse)
        )
        assert rqt.search(query, 15).item_ids[0].tolist() == _brute_force_rank_merge(
            store, query, None, 15
        )


def test_mixed_index_uses_new_vectors_and_psi_of_old_ones(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", 80) as store:
        _job(store, chunk=20).run(max_chunks=2)
        searcher = Searcher(store, build_serving_mode("mixed"), heads=HeadTransforms(forward=psi))
        # ψ(old) equals the backfilled vector here, so every item is found at distance 0 by its
        # own vector.
        target = psi(store.read_vectors("gen0", np.array([3, 70])))
        hits = searcher.search(target, 1)
        ids = [s["item_id"] for s in store.backfills.item_states()]
        assert hits.item_ids[:, 0].tolist() == [ids[3], ids[70]]
        assert np.allclose(hits.distances, 0.0, atol=1e-5)
        _job(store, chunk=20).run()
        hits = searcher.search(target, 1)  # the snapshot cache follows the commits
        assert set(hits.spaces[:, 0]) == {"gen1"}


def test_serving_modes_refuse_what_they_cannot_compare(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", 30) as store:
        _job(store, chunk=10).run(max_chunks=1)
        query = np.zeros((1, NEW.dim), np.float32) + 1
        with pytest.raises(UserError, match="not backward compatible"):
            Searcher(store, build_serving_mode("mixed")).search(query, 3)
        with pytest.raises(UserError, match="rank-merge"):
            Searcher(store, build_serving_mode("rank-merge")).search(query, 3)
        with pytest.raises(UserError, match="rank-merge-rqt"):
            Searcher(store, build_serving_mode("rank-merge-rqt")).search(query, 3)
        with pytest.raises(UserError, match="rank-merge-full"):
            Searcher(
                store, build_serving_mode("rank-merge-full"), heads=HeadTransforms(reverse=reverse)
            ).search(query, 3)
        with pytest.raises(UserError, match="4-d but gallery vectors are 16-d"):
            Searcher(
                store,
                build_serving_mode("rank-merge-rqt"),
                heads=HeadTransforms(reverse=lambda q: q[:, :4]),
            ).search(query, 3)
        with pytest.raises(UserError, match="12-d vectors"):
            Searcher(
                store, build_serving_mode("rank-merge-rqt"), heads=HeadTransforms(reverse=reverse)
            ).search(np.zeros((1, 16)), 3)
        with pytest.raises(UserError, match="old-model query vectors has 2 rows"):
            Searcher(store, build_serving_mode("rank-merge")).search(
                QueryVectors(query, np.zeros((2, 16))), 3
            )


def test_backward_compatible_space_serves_old_vectors_as_they_are(tmp_path: Path) -> None:
    compatible = SpaceSpec("gen1-bct", 16, upgrades_from=("gen0",), backward_compatible=True)
    with build_gallery(tmp_path / "s", 30) as store:
        BackfillJob(
            store,
            compatible,
            TransformStored(lambda v: v * 2.0),
            build_ordering("random"),
            10,
            progress=False,
        ).run(max_chunks=1)
        queries = store.read_vectors("gen0", np.arange(3))
        for mode, given in (("mixed", queries), ("rank-merge", QueryVectors(queries, queries))):
            hits = Searcher(store, build_serving_mode(mode)).search(given, 30)
            assert all(len(set(row)) == 30 for row in hits.item_ids)
            assert set(hits.spaces.ravel()) == {"gen0", "gen1-bct"}


# ----- the search command ------------------------------------------------------------------------
def _search(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    return command_output(capsys, search_command, *argv)


def test_search_command_prints_hits_with_their_space(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with build_gallery(tmp_path / "s", 60) as store:
        _job(store, "ingest-order", chunk=20).run(max_chunks=1)
    queries = tmp_path / "q.npy"
    np.save(queries, np.random.default_rng(0).normal(size=(4, NEW.dim)).astype(np.float32))
    store_arguments = ["--store", str(tmp_path / "s"), "--mode", "mixed"]
    code, _, err = _search(
        capsys, *store_arguments, "--queries", str(queries), "--rows", "1:3", "--k", "5", "--json"
    )
    # mixed needs a forward head for an incompatible space
    assert code == 2 and "not backward compatible" in err
    code, _, err = _search(capsys, *store_arguments, "--item-id", "item-00001", "--k", "3")
    assert code == 2 and "not backward compatible" in err
    with GalleryStore.open(tmp_path / "s") as store:
        _job(store, "ingest-order", chunk=20).run()
    code, out, _ = _search(
        capsys, *store_arguments, "--queries", str(queries), "--rows", "1:3", "--k", "5", "--json"
    )
    assert code == 0, out
    body = json.loads(out)
    assert [q["query"] for q in body] == ["row 1", "row 2"]
    assert all(len(q["hits"]) == 5 and {h["space"] for h in q["hits"]} == {"gen1"} for q in body)
    code, out, _ = _search(
        capsys, *store_arguments, "--queries", str(queries), "--rows", "3", "--k", "2"
    )
    assert code == 0 and out.startswith("query row 3:") and out.count("space=gen1") == 2
    for bad in ("a:b", "3:9", "2:1"):
        code, _, err = _search(capsys, *store_arguments, "--queries", str(queries), "--rows", bad)
        assert code == 2 and "--rows" in err
