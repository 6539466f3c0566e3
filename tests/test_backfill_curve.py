"""The one-pass backfill curve against the oracle and against a plain per-point recomputation."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from modelupgrade.backfill import (
    SearchSystems,
    backfill_curve,
    backfill_curves,
    evaluate_state,
    fastfill_grid,
    naive_curve,
    simulate_curve,
    uniform_grid,
)
from modelupgrade.errors import UserError

# a copy of shared/oracles
ORACLE = Path(__file__).resolve().parent / "oracles" / "backfill_leave_one_out.npz"


def step_ap(relevant, distances):
    """scikit-learn's step AP from its definition: precision at each
    positive's threshold d ≤ d_j."""
    at_or_before = distances[None, :] <= distances[relevant][:, None]
    return float(np.mean(at_or_before[:, relevant].sum(1) / at_or_before.sum(1)))


def test_step_ap_helper_is_sklearns_average_precision():
    rng = np.random.default_rng(0)
    relevant = rng.random(40) < 0.3
    distances = np.round(rng.random(40) * 5)  # heavy ties
    assert step_ap(relevant, distances) == pytest.approx(
        average_precision_score(relevant, -distances), abs=1e-12
    )


def reference_point(
    query_old,
    gallery_old,
    query_new,
    gallery_new,
    q_labels,
    g_labels,
    new_mask,
    self_index,
    distance,
    map_k,
):
    """One gallery state, written the obvious way: full distance rows, stable sort, sklearn AP."""

    def dist(q, g):
        q = q.astype(np.float64)
        g = g.astype(np.float64)
        if distance == "cosine":
            q = q / np.linalg.norm(q, axis=1, keepdims=True)
            g = g / np.linalg.norm(g, axis=1, keepdims=True)
            return 1.0 - q @ g.T
        return ((q[:, None, :] - g[None, :, :]) ** 2).sum(-1)

    d = np.where(new_mask[None, :], dist(query_new, gallery_new), dist(query_old, gallery_old))
    first, aps, apks = [], [], []
    for q in range(len(d)):
        keep = np.arange(d.shape[1]) != self_index[q]
        row, rel = d[q, keep], (g_labels[keep] == q_labels[q])
        # Ties: gallery order, new part first (the engine's documented rule).
        new_first = ~new_mask[keep]
        order = np.lexsort((np.arange(len(row)), new_first, row))
        hits = rel[order]
        first.append(int(np.argmax(hits)) if hits.any() else -1)
        if hits.any():
            aps.append(step_ap(rel, row))
            head = hits[:map_k]
            prec = np.cumsum(head) / np.arange(1, len(head) + 1)
            apks.append(float((prec * head).sum() / min(hits.sum(), map_k)))
        else:
            aps.append(np.nan)
            apks.append(0.0)
    return np.array(first), np.array(aps), np.array(apks)


def random_case(seed, n=60, nq=None, d=6, classes=5, quantise=False):
    rng = np.random.default_rng(seed)
    nq = n if nq is None else nq
    arrays = [rng.normal(size=(m, d)).astype(np.float32) for m in (nq, n, nq, n)]
    if quantise:  # coarse values: many exactly tied distances
        arrays = [np.round(a).astype(np.float32) + 0.5 for a in arrays]
    g_labels = rng.integers(0, classes, n)
    # one label may lack positives
    q_labels = g_labels if nq == n else rng.integers(0, classes + 1, nq)
    return SearchSystems(*arrays), q_labels, g_labels, rng.permutation(n)


def mixed_curve(systems, labels, ordering, steps, **options):
    """``simulate_curve`` of a mixed index: the new query searches the old and the new gallery."""
    return simulate_curve(
        systems.gallery_old_side,
        systems.gallery_new_side,
        systems.query_new_side,
        labels,
        ordering,
        steps,
        **options,
    )


def test_reproduces_fastfill_leave_one_out_oracle():
    z = np.load(ORACLE)
    curve = simulate_curve(
        z["old"],
        z["new"],
        z["new"],
        z["labels"],
        z["ordering"],
        int(z["steps"]),
        leave_one_out=True,
        distance="l2",
    )
    assert len(curve.t) == int(z["steps"]) + 2
    np.testing.assert_allclose(curve.top1, z["top1"], atol=1e-6, rtol=0)
    np.testing.assert_allclose(curve.top5, z["top5"], atol=1e-6, rtol=0)
    np.testing.assert_allclose(curve.mAP, z["mAP"], atol=1e-6, rtol=0)
    assert abs(curve.top1.mean() - float(z["auc_top1"])) < 1e-6
    assert abs(curve.top5.mean() - float(z["auc_top5"])) < 1e-6
    assert abs(curve.mAP.mean() - float(z["auc_mAP"])) < 1e-6


CASES = [
    (distance, merge, leave_one_out, quantise)
    for distance in ("l2", "cosine")
    for merge in (False, True)
    for leave_one_out in (True, False)
    # Exact ties only under l2 on half-integers: float32 cosines of equal angles need not be equal.
    for quantise in ((False, True) if distance == "l2" else (False,))
]


def case_systems(seed, merge, leave_one_out, quantise):
    """A random case served as rank merge (the old query searches the old part) or, without
    ``merge``, as a mixed index (the new query searches both parts)."""
    systems, q_labels, g_labels, ordering = random_case(
        seed=seed, nq=None if leave_one_out else 25, quantise=quantise
    )
    if not merge:
        new_query = systems.query_new_side
        systems = SearchSystems(
            new_query, systems.gallery_old_side, new_query, systems.gallery_new_side
        )
    return systems, q_labels, g_labels, ordering


@pytest.mark.parametrize(("distance", "merge", "leave_one_out", "quantise"), CASES)
def test_one_pass_curve_equals_per_point_recomputation(distance, merge, leave_one_out, quantise):
    # A fixed seed per case: str hashes change with PYTHONHASHSEED, and about one random draw in 500
    # holds two distances within float32 rounding, which the float64 reference orders differently.
    seed = zlib.crc32(repr((distance, merge, leave_one_out, quantise)).encode()) % 1000
    systems, q_labels, g_labels, ordering = case_systems(seed, merge, leave_one_out, quantise)
    n = len(g_labels)
    grid = uniform_grid(7, n)
    self_index = np.arange(n) if leave_one_out else np.full(len(q_labels), -1)
    curve = backfill_curve(
        systems,
        q_labels,
        g_labels,
        ordering,
        grid.cutoffs,
        grid.t,
        self_index=self_index,
        distance=distance,
        topk=(1, 3, 5),
        map_at_k=4,
        memory_bytes=150_000,  # small budget: several row blocks
    )
    for i, cutoff in enumerate(grid.cutoffs):
        mask = np.zeros(n, dtype=bool)
        mask[ordering[:cutoff]] = True
        first, aps, apks = reference_point(
            systems.query_old_side,
            systems.gallery_old_side,
            systems.query_new_side,
            systems.gallery_new_side,
            q_labels,
            g_labels,
            mask,
            self_index,
            distance,
            4,
        )
        np.testing.assert_array_equal(curve.per_query.first_hit[:, i], first)
        np.testing.assert_allclose(
            curve.per_query.average_precision[:, i], aps, atol=1e-7, equal_nan=True
        )
        np.testing.assert_allclose(curve.per_query.ap_at_k[:, i], apks, atol=1e-7)
        for k in (1, 3, 5):
            assert curve.topk[k][i] == pytest.approx(np.mean((first >= 0) & (first < k)), abs=1e-12)
        assert curve.mAP[i] == pytest.approx(np.nanmean(aps), abs=1e-7)


@pytest.mark.parametrize(("distance", "merge", "leave_one_out", "quantise"), CASES)
def test_several_orders_share_one_ranking_and_each_gets_its_own_curve(
    distance, merge, leave_one_out, quantise
):
    seed = zlib.crc32(repr(("shared", distance, merge, leave_one_out)).encode()) % 1000
    systems, q_labels, g_labels, ordering = case_systems(seed, merge, leave_one_out, quantise)
    n = len(g_labels)
    grid = uniform_grid(7, n)
    rng = np.random.default_rng(seed)
    orderings = [ordering, ordering[::-1].copy(), rng.permutation(n)]
    options = {
        "self_index": np.arange(n) if leave_one_out else None,
        "distance": distance,
        "topk": (1, 3),
        "map_at_k": 4,
        "memory_bytes": 150_000,  # several row blocks, each read once per order
    }
    shared = backfill_curves(
        systems, q_labels, g_labels, orderings, grid.cutoffs, grid.t, **options
    )
    assert len(shared) == len(orderings)
    for curve, order in zip(shared, orderings, strict=True):
        alone = backfill_curve(systems, q_labels, g_labels, order, grid.cutoffs, grid.t, **options)
        for name in ("first_hit", "average_precision", "ap_at_k"):
            np.testing.assert_array_equal(
                getattr(curve.per_query, name), getattr(alone.per_query, name)
            )
    # The orders differ in the middle of the backfill, so a curve read with another's order shows.
    assert not np.array_equal(
        shared[0].per_query.average_precision, shared[1].per_query.average_precision
    )
    with pytest.raises(UserError, match="no backfill ordering"):
        backfill_curves(systems, q_labels, g_labels, [], grid.cutoffs, grid.t, **options)


def test_fast_curve_equals_naive_loop_of_single_evaluations():
    systems, _, labels, ordering = random_case(seed=3, n=80)
    systems = SearchSystems(
        systems.query_new_side,
        systems.gallery_old_side,
        systems.query_new_side,
        systems.gallery_new_side,
    )
    grid = fastfill_grid(5, 80)
    fast = mixed_curve(systems, labels, ordering, grid, map_at_k=10)
    naive = naive_curve(systems, labels, labels, ordering, grid, leave_one_out=True, map_at_k=10)
    for name in ("top1", "top5", "mAP", "mAP@10"):
        np.testing.assert_allclose(fast.as_dict()[name], naive[name], atol=1e-7)


def test_end_points_are_the_cross_model_evaluations():
    systems, _, labels, ordering = random_case(seed=11, n=70)
    old_state, new_state = systems.gallery_old_side, systems.gallery_new_side
    query = systems.query_new_side
    curve = simulate_curve(
        old_state, new_state, query, labels, ordering, steps=[0.0, 0.5, 1.0], map_at_k=5
    )
    at_start = evaluate_state(query, old_state, labels, map_at_k=5)
    at_end = evaluate_state(query, new_state, labels, map_at_k=5)
    for name in ("top1", "top5", "mAP", "mAP@5"):
        assert curve.as_dict()[name][0] == pytest.approx(at_start.as_dict()[name][0], abs=1e-7)
        assert curve.as_dict()[name][-1] == pytest.approx(at_end.as_dict()[name][0], abs=1e-7)
    assert curve.negative_flip_rate[0] == 0.0 and curve.positive_flip_rate[0] == 0.0


def test_end_points_match_the_metrics_package_when_present():
    metrics = pytest.importorskip("modelupgrade.metrics.ranking")
    import torch

    systems, _, labels, ordering = random_case(seed=5, n=90)
    query, new_state = systems.query_new_side, systems.gallery_new_side
    curve = mixed_curve(systems, labels, ordering, steps=3, distance="cosine")
    q = torch.from_numpy(query / np.linalg.norm(query, axis=1, keepdims=True))
    g = torch.from_numpy(new_state / np.linalg.norm(new_state, axis=1, keepdims=True))
    ranked = metrics.rank_block(
        q @ g.T, torch.from_numpy(labels), torch.from_numpy(labels), torch.arange(90)
    )
    assert curve.mAP[-1] == pytest.approx(np.nanmean(ranked.average_precision), abs=1e-7)
    assert curve.top1[-1] == pytest.approx(ranked.correct_at(1).mean(), abs=1e-12)
    assert curve.top5[-1] == pytest.approx(ranked.correct_at(5).mean(), abs=1e-12)


def test_negative_flips_count_queries_lost_since_the_start():
    systems, _, labels, ordering = random_case(seed=8, n=50)
    curve = mixed_curve(systems, labels, ordering, steps=4)
    hit = curve.per_query.correct_at(1)
    np.testing.assert_allclose(curve.negative_flip_rate, (hit[:, :1] & ~hit).mean(0))
    np.testing.assert_allclose(
        curve.top1 - curve.top1[0], curve.positive_flip_rate - curve.negative_flip_rate, atol=1e-12
    )


def test_fastfill_grid_points_and_cutoffs():
    grid = fastfill_grid(10, 400)
    assert len(grid) == 12
    np.testing.assert_array_equal(grid.cutoffs, [(i * 400) // 11 for i in range(12)])
    uniform = uniform_grid(11, 10)
    np.testing.assert_array_equal(uniform.cutoffs, np.arange(11))  # t = 0.3 of 10 items is 3, not 2
    np.testing.assert_allclose(uniform.t, np.linspace(0, 1, 11))


def test_bad_inputs_are_user_errors():
    systems, _, labels, ordering = random_case(seed=1, n=20)
    with pytest.raises(UserError, match="permutation"):
        mixed_curve(systems, labels, np.zeros(20, dtype=int), steps=2)
    with pytest.raises(UserError, match="NaN"):
        bad = systems.gallery_new_side.copy()
        bad[0, 0] = np.nan
        simulate_curve(
            systems.gallery_old_side, bad, systems.query_new_side, labels, ordering, steps=2
        )
    with pytest.raises(UserError, match="query_labels"):
        simulate_curve(
            systems.gallery_old_side,
            systems.gallery_new_side,
            systems.query_new_side[:5],
            labels,
            ordering,
            steps=2,
            leave_one_out=False,
        )
