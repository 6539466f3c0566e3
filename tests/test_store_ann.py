"""Approximate-nearest-neighbour indexes of the gallery store (``store.index``), on both backends.

An index only finds each part's candidates; the shared kernel ranks them, so with a generous HNSW
search the store answers exactly as a flat store does, in every serving mode, while a backfill has
the gallery split between two spaces. The embedded store's FAISS index follows the gallery as
chunks commit; the status reports the index's recall@10 against an exact scan.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from modelupgrade.config.store import StoreIndexParams, StoreParams
from modelupgrade.errors import UserError
from modelupgrade.serving import build_serving_mode
from modelupgrade.store import BackendSettings, GalleryStore, HeadTransforms, QueryVectors, Searcher
from modelupgrade.store.backends.milvus import is_server_uri
from modelupgrade.store.search import index_recall
from tests.store_helpers import NEW, OLD, PROJECT_PARAMS, build_gallery, psi, psi_job, reverse

N_ITEMS = 400
CHUNK = 40
MODES = [
    ("rank-merge-rqt", HeadTransforms(reverse=reverse)),
    ("mixed", HeadTransforms(forward=psi)),
    ("rank-merge", HeadTransforms()),
]
GENEROUS_HNSW = StoreIndexParams(
    kind="hnsw", hnsw_m=16, hnsw_ef_construction=200, hnsw_ef_search=400
)


def _answers(store: GalleryStore, queries: QueryVectors) -> list:
    return [
        Searcher(store, build_serving_mode(mode), heads=heads).search(queries, k)
        for mode, heads in MODES
        for k in (1, 10)
    ]


def _queries(seed: int = 5) -> QueryVectors:
    rng = np.random.default_rng(seed)
    return QueryVectors(
        rng.normal(size=(8, NEW.dim)).astype(np.float32),
        rng.normal(size=(8, OLD.dim)).astype(np.float32),
    )


def test_hnsw_answers_equal_exact_search_in_every_serving_mode_during_a_backfill(
    backend: BackendSettings, tmp_path: Path
) -> None:
    queries = _queries()
    answers: dict[str, list[list]] = {}
    for kind, index in (("flat", StoreIndexParams()), ("hnsw", GENEROUS_HNSW)):
        settings = dataclasses.replace(backend, index=index)
        with build_gallery(tmp_path / kind, N_ITEMS, backend=settings) as store:
            job = psi_job(store, chunk=CHUNK, seed=0)
            answers[kind] = []
            # Before the backfill the old space's index takes all its rows; then the searches
            # filter it to the items not yet moved, and the new one grows chunk by chunk.
            for chunks in (0, 3, 2, None):
                job.run(max_chunks=chunks)
                answers[kind].append(_answers(store, queries))
            assert store.status().index["kind"] == index.kind
    for flat_stage, hnsw_stage in zip(answers["flat"], answers["hnsw"], strict=True):
        for exact, approximate in zip(flat_stage, hnsw_stage, strict=True):
            np.testing.assert_array_equal(approximate.item_ids, exact.item_ids)
            np.testing.assert_array_equal(approximate.spaces, exact.spaces)
            np.testing.assert_array_equal(approximate.distances, exact.distances)
            for ids in approximate.item_ids:
                assert len(set(ids)) == len(ids)
    # part-way, the hits name both spaces: the modes merged two indexed parts
    named = {str(space) for hits in answers["hnsw"][1] for space in hits.spaces.ravel()}
    assert named == {OLD.name, NEW.name}


def test_the_embedded_index_is_searched_extended_and_rebuilt_as_the_gallery_changes(
    tmp_path: Path,
) -> None:
    settings = BackendSettings(index=GENEROUS_HNSW)
    with build_gallery(tmp_path / "s", N_ITEMS, backend=settings) as store:
        searcher = Searcher(
            store, build_serving_mode("rank-merge-rqt"), heads=HeadTransforms(reverse=reverse)
        )
        indexed = store.vectors._indexes  # type: ignore[attr-defined]
        job = psi_job(store, chunk=CHUNK, seed=0)
        sizes = []
        for chunks in (0, 3, 2, 1):
            job.run(max_chunks=chunks)
            searcher.search(_queries().new, 10)
            sizes.append({name: index.size for name, index in indexed.items()})
        assert sizes == [
            {OLD.name: N_ITEMS},
            # the new space's index holds what committed; the old one is searched filtered
            {OLD.name: N_ITEMS, NEW.name: 3 * CHUNK},
            # extended by the chunks committed since; half the old rows are still served
            {OLD.name: N_ITEMS, NEW.name: 5 * CHUNK},
            # fewer than half: the old part gets an index of its own rows
            {OLD.name: N_ITEMS - 6 * CHUNK, NEW.name: 6 * CHUNK},
        ]


def test_status_reports_recall_at_10_against_an_exact_scan(
    backend: BackendSettings, tmp_path: Path
) -> None:
    vectors = np.random.default_rng(0).normal(size=(N_ITEMS, OLD.dim))
    recalls = {}
    for kind, index in (
        ("flat", StoreIndexParams()),
        ("hnsw", GENEROUS_HNSW),
        ("ivf", StoreIndexParams(kind="ivf", ivf_nlist=8, ivf_nprobe=1)),
    ):
        settings = dataclasses.replace(backend, index=index)
        with GalleryStore.create(tmp_path / kind, settings) as store:
            store.ingest([f"i{i}" for i in range(N_ITEMS)], vectors.astype(np.float32), OLD)
            report = index_recall(store)
        assert report["kind"] == kind
        # measured on the index itself: a vector database's built after the flush, waited for
        assert report["index_settled"] == {OLD.name: True}
        recalls[kind] = report["recall_at_10"][OLD.name]
    assert recalls["flat"] == 1.0
    assert recalls["hnsw"] == 1.0
    # one cell of eight per query misses the neighbours in the cells next to it (a Milvus server
    # searches a segment of fewer than 1,024 rows, or not yet handed over with its index,
    # exhaustively: there the index is not what answers yet, and recall is measured as 1.0)
    if not is_server_uri(backend.uri):
        assert recalls["ivf"] < 1.0


def test_store_status_command_shows_the_index_and_its_recall(tmp_path: Path) -> None:
    from modelupgrade.commands.store import store_status
    from modelupgrade.config import read_params

    with build_gallery(tmp_path / "s", 200, backend=BackendSettings(index=GENEROUS_HNSW)):
        pass
    status = store_status(read_params(PROJECT_PARAMS), tmp_path / "s").as_dict()
    assert status["index"]["kind"] == "hnsw"
    assert status["index"]["hnsw_ef_search"] == 400
    assert status["index"]["recall_at_10"] == {OLD.name: 1.0}


def test_the_index_options_are_checked_by_the_schema() -> None:
    assert StoreParams().index.kind == "flat"
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        StoreParams(index={"kind": "hnsw", "ef": 64})
    with pytest.raises(ValidationError, match="ivf_nprobe .* exceeds ivf_nlist"):
        StoreParams(index={"kind": "ivf", "ivf_nlist": 16, "ivf_nprobe": 32})
    with pytest.raises(ValidationError):
        StoreParams(index={"kind": "annoy"})


def test_an_approximate_index_searched_by_another_distance_is_one_clear_error(
    tmp_path: Path,
) -> None:
    settings = BackendSettings(index=GENEROUS_HNSW)
    with (
        build_gallery(tmp_path / "s", 200, backend=settings) as store,
        pytest.raises(UserError, match="ranks by cosine distance, the search asks for l2"),
    ):
        Searcher(store, build_serving_mode("mixed"), distance="l2").search(
            np.ones((1, OLD.dim), np.float32), 10
        )
