"""The embedded store's exact search (``store.matrices.SpaceMatrix``): a part's plain scan with
over-fetch and its selector fallback give each query exactly its best rows of the part, and the
index holds only the rows that exist."""

from __future__ import annotations

import numpy as np
import pytest

from modelupgrade.store.matrices import SpaceMatrix

DIM, N, LIMIT = 8, 4000, 12


def _stored() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(N, DIM)).astype(np.float32)


def _matrix(stored: np.ndarray, slots: np.ndarray, metric: str = "ip") -> SpaceMatrix:
    matrix = SpaceMatrix(DIM, metric)
    matrix.cover(slots, lambda wanted: wanted.astype(np.uint64) + 1, lambda wanted: stored[wanted])
    return matrix


def _exact(stored: np.ndarray, queries: np.ndarray, slots: np.ndarray, metric: str) -> np.ndarray:
    rows = stored[slots]
    if metric == "ip":
        rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        score = -(queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ rows.T
    else:
        score = ((queries[:, None, :] - rows[None]) ** 2).sum(-1)
    return np.unique(slots[np.argsort(score, axis=1)[:, :LIMIT]])


@pytest.mark.parametrize("metric", ["ip", "l2"])
@pytest.mark.parametrize("share", [0.02, 0.3, 0.5, 0.97])
def test_a_part_search_finds_each_querys_best_rows_of_the_part(metric: str, share: float) -> None:
    stored = _stored()
    every = np.arange(N)
    matrix = _matrix(stored, every, metric)
    slots = np.sort(np.random.default_rng(1).permutation(N)[: int(share * N)])
    queries = np.random.default_rng(2).normal(size=(30, DIM)).astype(np.float32)
    found = matrix.search(queries, LIMIT, matrix.part(slots))
    np.testing.assert_array_equal(found, _exact(stored, queries, slots, metric))


def test_a_query_whose_neighbours_lie_outside_its_part_is_searched_again() -> None:
    # The part is the half of the rows farthest from the query along one axis: a plain scan's
    # candidates are all outside it, and only the selector's search finds its rows.
    stored = _stored()
    matrix = _matrix(stored, np.arange(N), "l2")
    slots = np.sort(np.argsort(stored[:, 0])[: N // 2])
    queries = np.zeros((1, DIM), dtype=np.float32)
    queries[0, 0] = 10.0
    found = matrix.search(queries, LIMIT, matrix.part(slots))
    np.testing.assert_array_equal(found, _exact(stored, queries, slots, "l2"))


def test_the_index_holds_the_rows_that_exist_and_an_earlier_part_stays_right() -> None:
    stored = _stored()
    first = np.arange(0, N, 4)  # a space a backfill has filled a quarter of
    matrix = _matrix(stored, first)
    assert matrix.rows == len(first)
    part = matrix.part(first)
    more = np.arange(1, N, 4)
    matrix.cover(more, lambda wanted: wanted.astype(np.uint64) + 1, lambda wanted: stored[wanted])
    assert matrix.rows == len(first) + len(more)
    queries = np.random.default_rng(3).normal(size=(10, DIM)).astype(np.float32)
    np.testing.assert_array_equal(
        matrix.search(queries, LIMIT, part), _exact(stored, queries, first, "ip")
    )


def test_a_row_written_again_is_reloaded() -> None:
    stored = _stored()
    slots = np.arange(100)
    matrix = _matrix(stored, slots)
    changed = stored.copy()
    changed[7] = -stored[7]
    matrix.cover(
        slots,
        lambda wanted: wanted.astype(np.uint64) + 1 + (wanted == 7),
        lambda wanted: changed[wanted],
    )
    assert matrix.rows == 100
    query = changed[7:8]
    assert 7 in matrix.search(query, 1, matrix.part(slots))


def test_a_commit_appends_at_the_cost_of_its_rows_not_of_the_rows_held() -> None:
    # A backfill covers one chunk per commit; copying every row held on each append would make a
    # backfill's searches quadratic in the gallery (ψ's rows at 1,000,000 items: 512 MB a commit).
    stored = np.random.default_rng(4).normal(size=(64 * 400, DIM)).astype(np.float32)
    matrix = SpaceMatrix(DIM, "ip", transform=lambda rows: rows[:, ::-1] * 2.0)
    moves, buffer = 0, None
    for start in range(0, len(stored), 64):
        chunk = np.arange(start, start + 64)
        matrix.cover(chunk, lambda wanted: wanted.astype(np.uint64) + 1, lambda w: stored[w])
        address = matrix.raw.__array_interface__["data"][0]  # type: ignore[union-attr]
        moves, buffer = moves + (address != buffer), address
    assert matrix.rows == len(stored)
    assert moves <= 8, f"{moves} reallocations for 400 appends"
    every = np.arange(len(stored))
    np.testing.assert_array_equal(matrix.transformed(every), stored[:, ::-1] * 2.0)
