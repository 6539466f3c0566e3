"""Gallery store: ingest, ordering, serving modes, bad input, the CLI commands."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from modelupgrade.errors import UserError
from modelupgrade.store import (
    BackfillJob,
    ChunkCommit,
    GalleryStore,
    ImageFileSource,
    ItemSources,
    ReEmbedImages,
    Searcher,
    SpaceSpec,
    TransformStored,
    build_policy,
    build_serving_mode,
    start_or_resume,
)
from modelupgrade.store.serving import pairwise_distances
from tests.store_helpers import NEW, OLD, build_gallery, psi, reverse


def _job(store: GalleryStore, policy: str = "old-confidence", chunk: int = 32, target: SpaceSpec = NEW) -> BackfillJob:
    return BackfillJob(store, target, TransformStored(psi), build_policy(policy, seed=3), chunk, progress=False)


# ----- ingest and schema --------------------------------------------------------------------------
def test_ingest_then_reopen_keeps_items_vectors_and_scores(tmp_path: Path) -> None:
    vectors = np.random.default_rng(0).normal(size=(50, OLD.dim)).astype(np.float32)
    with GalleryStore.create(tmp_path / "s") as store:
        store.ingest([f"a{i}" for i in range(30)], vectors[:30], OLD, scores=np.arange(30.0))
        store.ingest([f"a{i}" for i in range(30, 50)], vectors[30:], OLD, scores=np.arange(30.0, 50.0))
    with GalleryStore.open(tmp_path / "s") as store:
        np.testing.assert_array_equal(store.read_vectors("gen0", np.arange(50)), vectors)
        assert store.scores()[1].tolist() == list(np.arange(50.0))
        assert store.status().serving_space == "gen0"


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
    with pytest.raises(UserError, match="schema version 99, this modelupgrade reads version 1"):
        GalleryStore.open(tmp_path / "s")
    with pytest.raises(UserError, match="no gallery store"):
        GalleryStore.open(tmp_path / "nowhere")


# ----- backfill ------------------------------------------------------------------------------------
def test_backfill_follows_the_policy_order_chunk_by_chunk(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", 100) as store:
        _, scores = store.scores()
        report = _job(store, "old-confidence", chunk=30).run(max_chunks=1)
        assert report.status == "paused" and report.items_written == 30
        done = [s["slot"] for s in store.item_states() if s["state"] == "done"]
        assert sorted(done) == sorted(np.argsort(scores)[:30].tolist())  # lowest confidence first
        assert _job(store, chunk=30).run().status == "complete"
        assert [c["items"] for c in store.chunk_log()] == [30, 30, 30, 10]
        # chunks of 30 and one batch of 100 take different BLAS blockings: equal to float32 rounding, not bitwise
        np.testing.assert_allclose(
            store.read_vectors("gen1", np.arange(100)),
            psi(store.read_vectors("gen0", np.arange(100))),
            rtol=1e-5,
            atol=1e-6,
        )
        assert store.status().by_space == {"gen1": 100}


def test_chunks_computed_during_a_slow_commit_are_committed_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with build_gallery(tmp_path / "s", 100) as store:
        groups: list[list[int]] = []
        real_commit = store.commit_chunks

        def slow_commit(space, commits):  # type: ignore[no-untyped-def]
            groups.append([c.chunk.index for c in commits])
            time.sleep(0.2)  # a sync far slower than ψ: the next chunks finish meanwhile
            real_commit(space, commits)

        monkeypatch.setattr(store, "commit_chunks", slow_commit)
        assert _job(store, chunk=10).run().status == "complete"
        assert [i for group in groups for i in group] == list(range(10))  # every chunk once, in order
        assert len(groups) < 10 and max(map(len, groups)) > 1
        assert [c["chunk"] for c in store.chunk_log()] == list(range(10))  # the log keeps one row per chunk
        assert store.status().by_space == {"gen1": 100}


def test_a_group_commit_is_all_or_nothing(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", 40) as store:
        backfill = start_or_resume(store, NEW, "transform", build_policy("old-confidence"), 10)
        first, second = store.next_chunks(backfill, limit=2)
        vectors = psi(store.read_vectors("gen0", first.slots))
        store.write_vectors("gen1", first.slots, vectors)
        store.commit_chunk(first, "gen1", first.slots, {}, "digest")
        group = [ChunkCommit(second, second.slots, {}, "digest"), ChunkCommit(first, first.slots, {}, "digest")]
        with pytest.raises(RuntimeError, match="already committed"):
            store.commit_chunks("gen1", group)
        assert [c["chunk"] for c in store.chunk_log()] == [0]  # the second chunk rolled back with the first
        assert store.next_chunk(backfill).index == 1


def test_descending_and_random_policies(tmp_path: Path) -> None:
    slots, scores = np.arange(5), np.array([0.3, 0.9, 0.1, 0.9, 0.5])
    assert build_policy("fastfill-uncertainty").order(slots, scores).tolist() == [1, 3, 4, 0, 2]
    assert build_policy("old-entropy").order(slots, scores).tolist() == [1, 3, 4, 0, 2]
    first, again = build_policy("random", 1).order(slots, scores), build_policy("random", 1).order(slots, scores)
    assert first.tolist() == again.tolist() and sorted(first.tolist()) == list(range(5))
    with pytest.raises(UserError, match="no ordering score"):
        build_policy("old-confidence").order(slots, np.array([0.1, np.nan, 0.2, 0.3, 0.4]))
    with pytest.raises(UserError, match="unknown backfill ordering policy"):
        build_policy("cheapest-first")


def test_an_incompatible_generation_is_refused(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", 20) as store:
        gen2 = SpaceSpec("gen2", 12, upgrades_from=("gen1",))
        with pytest.raises(UserError, match="upgrades from gen1"):
            _job(store, target=gen2).run()
        assert store.active_backfill() is None
        _job(store, chunk=8).run(max_chunks=1)
        with pytest.raises(UserError, match="still running"):
            _job(store, target=SpaceSpec("gen1b", 12, upgrades_from=("gen0",))).run()
        with pytest.raises(UserError, match="dimension"):
            store.add_space(SpaceSpec("gen1", 10, upgrades_from=("gen0",)))


def test_a_model_of_the_wrong_dimension_stops_the_job_before_any_commit(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", 20) as store:
        wrong = BackfillJob(store, NEW, TransformStored(lambda v: v[:, :5]), build_policy("ingest-order"), 8,
                            progress=False)
        with pytest.raises(UserError, match="5-d vectors, but space 'gen1' holds 12-d"):
            wrong.run()
        assert store.chunk_log() == [] and store.status().backfill["pending"] == 20


def _image_gallery(tmp_path: Path, n: int, corrupt: set[int]) -> tuple[GalleryStore, Path]:
    root = tmp_path / "images"
    root.mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        if i in corrupt:
            (root / f"{i}.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
        else:
            Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(root / f"{i}.png")
    store = GalleryStore.create(tmp_path / "s")
    store.ingest([f"img{i}" for i in range(n)], rng.normal(size=(n, OLD.dim)), OLD,
                 ItemSources([f"{i}.png" for i in range(n)]), scores=rng.random(n))
    return store, root


def _embed(images: np.ndarray) -> np.ndarray:
    flat = images.reshape(len(images), -1).astype(np.float32) / 255.0
    return flat[:, : NEW.dim] - 0.5


def test_a_corrupt_image_is_logged_skipped_listed_and_served_from_the_old_space(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, root = _image_gallery(tmp_path, 40, corrupt={17})
    with store:
        job = BackfillJob(store, NEW, ReEmbedImages(ImageFileSource(root), _embed), build_policy("ingest-order"), 10,
                          progress=False)
        report = job.run()
        assert report.status == "complete"
        assert [f["item_id"] for f in report.failed] == ["img17"]
        assert "cannot decode" in report.failed[0]["reason"]
        assert "img17" in caplog.text
        states = {s["item_id"]: s for s in store.item_states()}
        assert states["img17"]["state"] == "failed" and states["img17"]["space"] == "gen0"
        assert sum(s["state"] == "done" for s in states.values()) == 39
        assert store.chunk_log()[1]["failed"] == 1 and store.chunk_log()[1]["written"] == 9
        hits = Searcher(store, build_serving_mode("rank-merge", reverse=reverse)).search(
            np.zeros((1, NEW.dim), np.float32) + 0.1, k=40)
        assert "img17" in set(hits.item_ids[0])  # never silently dropped from the gallery
        with pytest.raises(UserError, match="retry them first"):
            _job(store, target=SpaceSpec("gen2", 12, upgrades_from=("gen1",))).run()
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / "17.png")
        store.retry_failed()
        retried = job.run()
        assert retried.status == "complete" and retried.items_written == 1 and not retried.failed
        assert store.status().by_space == {"gen1": 40}


# ----- serving -------------------------------------------------------------------------------------
def _brute_force_rank_merge(store: GalleryStore, query: np.ndarray, k: int) -> list[str]:
    states = store.item_states()
    scored = []
    for s in states:
        if s["space"] == "gen1":
            d = pairwise_distances(query[None], store.read_vectors("gen1", np.array([s["slot"]])), "cosine")[0, 0]
        else:
            d = pairwise_distances(reverse(query[None]), store.read_vectors("gen0", np.array([s["slot"]])), "cosine")[0, 0]
        scored.append((d, s["space"] != "gen1", s["item_id"]))
    return [item for _, _, item in sorted(scored)[:k]]


def test_rank_merge_equals_a_brute_force_merge_and_names_spaces(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", 120) as store:
        _job(store, chunk=20).run(max_chunks=3)
        query = np.random.default_rng(5).normal(size=NEW.dim).astype(np.float32)
        hits = Searcher(store, build_serving_mode("rank-merge", reverse=reverse)).search(query, 15)
        assert hits.item_ids[0].tolist() == _brute_force_rank_merge(store, query, 15)
        space_of = {s["item_id"]: s["space"] for s in store.item_states()}
        assert [space_of[i] for i in hits.item_ids[0]] == hits.spaces[0].tolist()


def test_mixed_index_uses_new_vectors_and_psi_of_old_ones(tmp_path: Path) -> None:
    with build_gallery(tmp_path / "s", 80) as store:
        _job(store, chunk=20).run(max_chunks=2)
        searcher = Searcher(store, build_serving_mode("mixed", forward=psi))
        # ψ(old) equals the backfilled vector here, so every item is found at distance 0 by its own vector.
        target = psi(store.read_vectors("gen0", np.array([3, 70])))
        hits = searcher.search(target, 1)
        ids = [s["item_id"] for s in store.item_states()]
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
        with pytest.raises(UserError, match="needs a reverse head"):
            Searcher(store, build_serving_mode("rank-merge")).search(query, 3)
        with pytest.raises(UserError, match="takes no reverse head"):
            build_serving_mode("mixed", reverse=reverse)
        with pytest.raises(UserError, match=r"shape \(1, 4\), expected \(1, 16\)"):
            Searcher(store, build_serving_mode("rank-merge", reverse=lambda q: q[:, :4])).search(query, 3)
        with pytest.raises(UserError, match="12-d vectors"):
            Searcher(store, build_serving_mode("rank-merge", reverse=reverse)).search(np.zeros((1, 16)), 3)


def test_backward_compatible_space_serves_old_vectors_as_they_are(tmp_path: Path) -> None:
    compatible = SpaceSpec("gen1-bct", 16, upgrades_from=("gen0",), backward_compatible=True)
    with build_gallery(tmp_path / "s", 30) as store:
        BackfillJob(store, compatible, TransformStored(lambda v: v * 2.0), build_policy("random"), 10,
                    progress=False).run(max_chunks=1)
        for mode in ("mixed", "rank-merge"):
            hits = Searcher(store, build_serving_mode(mode)).search(store.read_vectors("gen0", np.arange(3)), 30)
            assert all(len(set(row)) == 30 for row in hits.item_ids)
            assert set(hits.spaces.ravel()) == {"gen0", "gen1-bct"}


# ----- CLI ------------------------------------------------------------------------------------------
def test_cli_search_prints_hits_with_their_space(tmp_path: Path) -> None:
    from modelupgrade.cli.store import register

    with build_gallery(tmp_path / "s", 60) as store:
        start_or_resume(store, NEW, "transform", build_policy("ingest-order"), 20)
        _job(store, "ingest-order", chunk=20).run(max_chunks=1)
    queries = tmp_path / "q.npy"
    np.save(queries, np.random.default_rng(0).normal(size=(4, NEW.dim)).astype(np.float32))
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    result = runner.invoke(app, ["search", "--store", str(tmp_path / "s"), "--queries", str(queries), "--rows", "1:3",
                                 "--k", "5", "--mode", "mixed", "--json", "--params", str(tmp_path / "none.yaml")])
    assert result.exit_code != 0  # mixed needs a forward head for an incompatible space
    assert "not backward compatible" in str(result.exception)
    result = runner.invoke(app, ["search", "--store", str(tmp_path / "s"), "--item-id", "item-00001", "--k", "3",
                                 "--mode", "mixed", "--params", str(tmp_path / "none.yaml")])
    assert "not backward compatible" in str(result.exception)
    with GalleryStore.open(tmp_path / "s") as store:
        _job(store, "ingest-order", chunk=20).run()
    result = runner.invoke(app, ["search", "--store", str(tmp_path / "s"), "--queries", str(queries), "--rows", "1:3",
                                 "--k", "5", "--mode", "mixed", "--json", "--params", str(tmp_path / "none.yaml")])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert [q["query"] for q in body] == ["row 0", "row 1"]
    assert all(len(q["hits"]) == 5 and {h["space"] for h in q["hits"]} == {"gen1"} for q in body)
