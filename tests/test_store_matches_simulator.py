"""A simulated backfill curve is what the real store serves: same order, same top-k, same metrics.

For every deployable ordering policy and every serving mode, one store and one simulation are built
from the same embeddings and heads. The store is backfilled chunk by chunk to each point of the
simulator's grid, searched there with every query, and its answers are scored: each point must equal
the simulator's curve point, query by query (rank of the first positive, step AP) and on average.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelupgrade.backfill import ServingArrays, backfill_curve, first_new_step, uniform_grid
from modelupgrade.errors import UserError
from modelupgrade.ordering import ORDERINGS, OrderingInputs, build_ordering
from modelupgrade.retrieval import DistanceBlock, RankedPart, merged_topk
from modelupgrade.serving import SERVING_MODES, build_serving_mode
from modelupgrade.store import (
    BackfillJob,
    GalleryStore,
    HeadTransforms,
    QueryVectors,
    Searcher,
    SpaceSpec,
    TableVectors,
)

N, QUERIES, OLD_DIM, NEW_DIM, CLASSES, SEED = 48, 20, 8, 6, 4, 11
DEPLOYABLE = [name for name in ORDERINGS.names() if build_ordering(name).deployable]


def _map(seed: int, rows: int, columns: int):  # a vectors → vectors map
    # float64 inside, float32 out: the same vector maps to the same bits in any batch.
    matrix = np.random.default_rng(seed).normal(size=(rows, columns))
    return lambda vectors: np.tanh(np.asarray(vectors, np.float64) @ matrix).astype(np.float32)


FORWARD, REVERSE = _map(1, OLD_DIM, NEW_DIM), _map(2, NEW_DIM, OLD_DIM)
RHO, RHO_REVERSE_PART = _map(3, NEW_DIM, NEW_DIM), _map(4, NEW_DIM, OLD_DIM)


def rho_reverse(vectors: np.ndarray) -> np.ndarray:
    return RHO_REVERSE_PART(RHO(vectors))


HEADS = HeadTransforms(forward=FORWARD, reverse=REVERSE, rho=RHO, rho_reverse=rho_reverse)


@pytest.fixture(scope="module")
def study() -> dict:
    rng = np.random.default_rng(0)
    gallery_labels = rng.integers(0, CLASSES, N)
    query_labels = rng.integers(0, CLASSES, QUERIES)
    old_gallery = rng.normal(size=(N, OLD_DIM)).astype(np.float32)
    new_gallery = (rng.normal(size=(N, NEW_DIM)) + gallery_labels[:, None]).astype(np.float32)
    old_query = rng.normal(size=(QUERIES, OLD_DIM)).astype(np.float32)
    new_query = (rng.normal(size=(QUERIES, NEW_DIM)) + query_labels[:, None]).astype(np.float32)
    arrays = ServingArrays(
        old_query=old_query,
        new_query=new_query,
        old_gallery=old_gallery,
        new_gallery=new_gallery,
        forward_gallery=FORWARD(old_gallery),
        reverse_query=REVERSE(new_query),
        rho_query=RHO(new_query),
        rho_gallery=RHO(new_gallery),
        rho_reverse_query=rho_reverse(new_query),
    )
    inputs = OrderingInputs(N, old_logits=rng.normal(size=(N, CLASSES)) * 2, sigma2=rng.random(N))
    return {
        "arrays": arrays,
        "inputs": inputs,
        "gallery_labels": gallery_labels,
        "query_labels": query_labels,
    }


def _store(path: Path, study: dict) -> GalleryStore:
    store = GalleryStore.create(path)
    inputs = study["inputs"]
    scores = {
        kind: inputs.score(kind) for kind in ("old-confidence", "old-entropy", "fastfill-sigma2")
    }
    store.ingest(
        [f"g{i}" for i in range(N)],
        study["arrays"].old_gallery,
        SpaceSpec("gen0", OLD_DIM),
        scores=scores,
    )
    return store


def _scored(
    hits_ids: np.ndarray, item_labels: dict[str, int], query_labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(0-based rank of the first positive, AP) of each query from its full ranked list."""
    first_hit, average_precision = [], []
    for row, label in zip(hits_ids, query_labels, strict=True):
        relevant = np.array([item_labels[item] == label for item in row])
        ranks = np.flatnonzero(relevant)
        first_hit.append(ranks[0] if len(ranks) else -1)
        average_precision.append(
            np.mean(np.arange(1, len(ranks) + 1) / (ranks + 1)) if len(ranks) else np.nan
        )
    return np.array(first_hit), np.array(average_precision)


def _expected_topk(systems, first_new: np.ndarray, step: int, k: int) -> np.ndarray:
    """The simulator's arrays ranked at ``step`` by the shared ranking rule:
    gallery rows, best first."""
    new_rows, old_rows = np.flatnonzero(first_new <= step), np.flatnonzero(first_new > step)
    parts = [
        RankedPart(
            DistanceBlock(systems.query_new_side, systems.gallery_new_side[new_rows], "cosine")(),
            new_rows,
            "new",
        ),
        RankedPart(
            DistanceBlock(systems.query_old_side, systems.gallery_old_side[old_rows], "cosine")(),
            old_rows,
            "old",
        ),
    ]
    return merged_topk(parts, k, len(systems.query_new_side)).columns


@pytest.mark.parametrize("mode", SERVING_MODES.names())
@pytest.mark.parametrize("policy", DEPLOYABLE)
def test_the_store_serves_the_simulated_curve_at_every_point(
    tmp_path: Path, study: dict, policy: str, mode: str
) -> None:
    arrays, inputs = study["arrays"], study["inputs"]
    q_labels, g_labels = study["query_labels"], study["gallery_labels"]
    plan = build_serving_mode(mode).plan(arrays.forms())
    systems = arrays.systems(plan)
    order = build_ordering(policy).order_items(inputs, SEED)
    grid = uniform_grid(5, N)
    curve = backfill_curve(
        systems, q_labels, g_labels, order, grid.cutoffs, grid.t, distance="cosine", topk=(1, 5)
    )
    first_new = first_new_step(order, grid.cutoffs, N)

    full_method = mode == "rank-merge-full"
    target = SpaceSpec("gen1", NEW_DIM, ("gen0",), form="rho" if full_method else "new")
    table = arrays.rho_gallery if full_method else arrays.new_gallery
    item_labels = {f"g{i}": int(label) for i, label in enumerate(g_labels)}
    with _store(tmp_path / "store", study) as store:
        job = BackfillJob(
            store,
            target,
            TableVectors([f"g{i}" for i in range(N)], table),
            build_ordering(policy),
            chunk_size=1,
            seed=SEED,
            progress=False,
        )
        searcher = Searcher(store, build_serving_mode(mode), "cosine", HEADS)
        queries = QueryVectors(arrays.new_query, arrays.old_query)
        committed = 0
        for step, cutoff in enumerate(grid.cutoffs):
            job.run(max_chunks=int(cutoff) - committed)
            committed = int(cutoff)
            assert store.status().items_by_space.get("gen1", 0) == cutoff
            hits = searcher.search(queries, k=N)
            assert all(len(set(row)) == N for row in hits.item_ids)  # every item once
            first_hit, average_precision = _scored(hits.item_ids, item_labels, q_labels)
            np.testing.assert_array_equal(first_hit, curve.per_query.first_hit[:, step])
            # The curve engine divides in float32: its AP equals the exact one to float32 rounding.
            np.testing.assert_allclose(
                average_precision, curve.per_query.average_precision[:, step], rtol=1e-6
            )
            assert np.mean((first_hit >= 0) & (first_hit < 1)) == curve.top1[step]
            assert np.mean((first_hit >= 0) & (first_hit < 5)) == curve.top5[step]
            assert np.nanmean(average_precision) == pytest.approx(curve.mAP[step], rel=1e-6)
            expected = _expected_topk(systems, first_new, step, 10)
            assert (hits.item_ids[:, :10] == np.vectorize(lambda row: f"g{row}")(expected)).all()
        assert store.status().backfill.status == "complete"


def test_the_oracle_order_cannot_run_on_a_store(tmp_path: Path, study: dict) -> None:
    with _store(tmp_path / "store", study) as store:
        job = BackfillJob(
            store,
            SpaceSpec("gen1", NEW_DIM, ("gen0",)),
            TableVectors([f"g{i}" for i in range(N)], study["arrays"].new_gallery),
            build_ordering("oracle"),
            4,
            progress=False,
        )
        with pytest.raises(UserError, match="holds no 'alignment-error' scores"):
            job.run()
        assert store.backfills.active() is None
