"""Exact search where FAISS is not installed (a lent GPU machine): ``TorchFlatIndex``.

The evaluation's top-k search goes through ``GallerySearcher``; without FAISS its exact ``flat``
index is torch's. It must return what FAISS's flat index returns: the same rows, best first, the
same scores, the same restriction to allowed rows and the same padding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from modelupgrade.errors import UserError
from modelupgrade.retrieval import index as search_index
from modelupgrade.retrieval.index import (
    FlatIndex,
    GallerySearcher,
    SearchOptions,
    TorchFlatIndex,
    normalised_float32,
    torch_knn,
)


def vectors(rows: int, seed: int, dim: int = 24) -> np.ndarray:
    return normalised_float32(np.random.default_rng(seed).standard_normal((rows, dim)))


@pytest.fixture
def without_faiss(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_index, "faiss_installed", lambda: False)


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_the_torch_index_returns_what_faiss_flat_returns(metric: str) -> None:
    pytest.importorskip("faiss")
    queries, gallery = vectors(40, 0), vectors(300, 1)
    options = SearchOptions(metric=metric)
    faiss_index, torch_index = FlatIndex(24, options), TorchFlatIndex(24, options)
    for index in (faiss_index, torch_index):
        index.add(gallery[:200])
        index.add(gallery[200:])
    assert torch_index.size == faiss_index.size == 300
    expected_scores, expected_ids = faiss_index.search(queries, 10)
    scores, ids = torch_index.search(queries, 10)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, atol=1e-5)
    allowed = np.random.default_rng(2).random(300) < 0.2
    expected_scores, expected_ids = faiss_index.search(queries, 80, allowed)
    scores, ids = torch_index.search(queries, 80, allowed)
    assert (ids == -1).any()  # fewer allowed rows than asked for: padded as FAISS pads
    np.testing.assert_array_equal(ids, expected_ids)
    found = ids >= 0
    np.testing.assert_allclose(scores[found], expected_scores[found], atol=1e-5)


def test_without_faiss_the_searcher_searches_exactly_with_torch(without_faiss: None) -> None:
    queries, gallery = vectors(30, 3), vectors(500, 4)
    searcher = GallerySearcher(gallery, SearchOptions(gallery_block=200, query_block=7))
    assert searcher.describe()["engine"] == "torch" and searcher.exact
    assert not searcher.use_gpu or torch.cuda.is_available()
    scores, ids = searcher.search(queries, 12)
    reference_scores, reference_ids = torch_knn(queries, gallery, 12)
    np.testing.assert_array_equal(ids, reference_ids)
    np.testing.assert_allclose(scores, reference_scores, atol=1e-5)


def test_without_faiss_an_approximate_index_is_refused(without_faiss: None) -> None:
    with pytest.raises(UserError, match="FAISS is not installed"):
        GallerySearcher(vectors(50, 5), SearchOptions(index="hnsw"))


@pytest.mark.gpu
def test_without_faiss_the_search_on_the_gpu_equals_the_cpu(without_faiss: None) -> None:
    queries, gallery = vectors(300, 6, dim=128), vectors(20_000, 7, dim=128)
    cpu_scores, cpu_ids = GallerySearcher(gallery, SearchOptions(use_gpu="never")).search(
        queries, 50
    )
    searcher = GallerySearcher(gallery, SearchOptions(use_gpu="always"))
    assert searcher.use_gpu
    scores, ids = searcher.search(queries, 50)
    assert (ids == cpu_ids).mean() > 0.999
    np.testing.assert_allclose(scores, cpu_scores, atol=1e-4)
