"""FAISS search against a brute-force torch reference; sharding, blocking, self-exclusion."""

from __future__ import annotations

import numpy as np
import pytest

from modelupgrade.errors import UserError
from modelupgrade.retrieval.index import (
    INDEXES,
    GallerySearcher,
    SearchOptions,
    exclude_self,
    merge_topk,
    torch_knn,
)


def search_topk(
    queries: np.ndarray, gallery: np.ndarray, k: int, options: SearchOptions | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Cosine top-k of ``queries`` in ``gallery`` through a one-off index."""
    return GallerySearcher(gallery, options).search(queries, k)


def _data(n_gallery: int = 3000, n_query: int = 200, dim: int = 32, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((n_query, dim)).astype(np.float32),
        rng.standard_normal((n_gallery, dim)).astype(np.float32),
    )


@pytest.mark.parametrize("gallery_block, query_block", [(1_000_000, 4096), (701, 33)])
def test_exact_flat_search_equals_torch_brute_force(gallery_block: int, query_block: int) -> None:
    queries, gallery = _data()
    options = SearchOptions(gallery_block=gallery_block, query_block=query_block, use_gpu="never")
    scores, ids = search_topk(queries, gallery, 20, options)
    ref_scores, ref_ids = torch_knn(queries, gallery, 20, query_block=64)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-5)
    # Ties aside: wherever two ids differ, their scores must be equal within float error.
    differ = ids != ref_ids
    assert differ.mean() < 1e-3
    np.testing.assert_allclose(scores[differ], ref_scores[differ], atol=1e-5)


def test_k_larger_than_gallery_pads_with_minus_one() -> None:
    queries, gallery = _data(n_gallery=5, n_query=3)
    _, ids = search_topk(queries, gallery, 8, SearchOptions(gallery_block=2, use_gpu="never"))
    assert (ids[:, :5] >= 0).all() and (ids[:, 5:] == -1).all()
    assert all(sorted(row[:5]) == list(range(5)) for row in ids)


def test_merge_topk_orders_shards() -> None:
    _scores, ids = merge_topk(
        [np.array([[0.9, 0.1]]), np.array([[0.5, -np.inf]])],
        [np.array([[3, 4]]), np.array([[7, -1]])],
        3,
    )
    np.testing.assert_array_equal(ids, [[3, 7, 4]])


def test_exclude_self_drops_own_row_or_last_column() -> None:
    ids = np.array([[0, 5, 6], [7, 8, 9]])
    scores = np.array([[1.0, 0.5, 0.4], [0.9, 0.8, 0.7]])
    kept, kept_scores = exclude_self(ids, scores, np.array([0, 1]), 2)
    np.testing.assert_array_equal(kept, [[5, 6], [7, 8]])
    np.testing.assert_allclose(kept_scores, [[0.5, 0.4], [0.9, 0.8]])


def test_approximate_indexes_find_most_neighbours() -> None:
    queries, gallery = _data()
    _, ref = torch_knn(queries, gallery, 10)
    for kind in ("ivf", "hnsw"):
        _, ids = search_topk(
            queries,
            gallery,
            10,
            SearchOptions(index=kind, ivf_nlist=16, ivf_nprobe=8, use_gpu="never"),
        )
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, ref, strict=True)])
        assert recall > 0.6, kind


def test_bad_input_is_a_user_error() -> None:
    queries, gallery = _data(n_gallery=50)
    with pytest.raises(UserError, match="cells"):
        GallerySearcher(gallery, SearchOptions(index="ivf", ivf_nlist=64, use_gpu="never"))
    with pytest.raises(UserError, match="-d"):
        GallerySearcher(gallery, SearchOptions(use_gpu="never")).search(queries[:, :5], 3)
    with pytest.raises(UserError, match="unknown search index"):
        INDEXES.get("lsh")
    bad = gallery.copy()
    bad[0, 0] = np.nan
    with pytest.raises(UserError, match="NaN"):
        GallerySearcher(bad)


def test_always_gpu_without_gpu_support_is_refused() -> None:
    from modelupgrade.retrieval.index import faiss_gpu_available

    if faiss_gpu_available():
        pytest.skip("this FAISS build has a GPU")
    _, gallery = _data(n_gallery=10)
    with pytest.raises(UserError, match="GPU"):
        GallerySearcher(gallery, SearchOptions(use_gpu="always"))


@pytest.mark.gpu
def test_gpu_flat_search_equals_cpu() -> None:
    from modelupgrade.retrieval.index import faiss_gpu_available

    if not faiss_gpu_available():
        pytest.skip("FAISS has no GPU support here (install faiss-gpu)")
    queries, gallery = _data()
    _, cpu_ids = search_topk(queries, gallery, 10, SearchOptions(use_gpu="never"))
    searcher = GallerySearcher(gallery, SearchOptions(use_gpu="always"))
    assert searcher.use_gpu
    _, gpu_ids = searcher.search(queries, 10)
    assert (gpu_ids == cpu_ids).mean() > 0.999


@pytest.mark.slow
def test_100k_gallery_10k_queries_runs_in_bounded_memory() -> None:
    rng = np.random.default_rng(0)
    gallery = rng.standard_normal((100_000, 128)).astype(np.float32)
    queries = rng.standard_normal((10_000, 128)).astype(np.float32)
    _, ids = search_topk(
        queries, gallery, 100, SearchOptions(query_block=2048, gallery_block=50_000)
    )
    assert ids.shape == (10_000, 100) and (ids >= 0).all()
