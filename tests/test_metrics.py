"""Metric semantics against scikit-learn and hand-computed cases: ties, self-exclusion, rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score
from sklearn.metrics import roc_curve as sklearn_roc_curve

from modelupgrade.errors import UserError
from modelupgrade.metrics import (
    average_compatibility,
    average_multimodel_accuracy,
    backward_compatibility,
    cmc_topk,
    compatibility_summary,
    degradation,
    forward_compatibility,
    gldv2_map_at_k,
    leave_one_out_map,
    mean_average_precision,
    negative_flip_rate,
    negative_flips,
    rank_features,
    rank_queries,
    revisitop_average_precision,
    revisitop_map,
    roc_curve,
    tar_at_far,
    upgrade_gain,
)


def _sklearn_map(
    scores: np.ndarray, query_labels: np.ndarray, gallery_labels: np.ndarray, leave_one_out: bool
) -> float:
    aps = []
    for i, row in enumerate(scores):
        keep = np.ones(len(row), bool)
        if leave_one_out:
            keep[i] = False
        truth = gallery_labels[keep] == query_labels[i]
        if truth.any():
            aps.append(average_precision_score(truth, row[keep]))
    return float(np.mean(aps))


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_step_ap_matches_sklearn_with_many_ties(leave_one_out: bool) -> None:
    rng = np.random.default_rng(1)
    n_gallery = 60
    n_query = n_gallery if leave_one_out else 25
    scores = rng.integers(0, 6, size=(n_query, n_gallery)).astype(np.float64)  # heavy ties
    gallery_labels = rng.integers(0, 5, size=n_gallery)
    query_labels = gallery_labels if leave_one_out else rng.integers(0, 6, size=n_query)
    ours = mean_average_precision(scores, query_labels, gallery_labels, leave_one_out=leave_one_out)
    assert ours == pytest.approx(
        _sklearn_map(scores, query_labels, gallery_labels, leave_one_out), abs=1e-12
    )


def test_blocked_ranking_equals_one_block() -> None:
    rng = np.random.default_rng(2)
    scores = rng.standard_normal((37, 50))
    ql, gl = rng.integers(0, 4, 37), rng.integers(0, 4, 50)
    whole = rank_queries(scores, ql, gl, ap_k=10)
    tiny = rank_queries(scores, ql, gl, ap_k=10, memory_bytes=1)  # one query per block
    np.testing.assert_array_equal(whole.first_hit, tiny.first_hit)
    np.testing.assert_allclose(whole.average_precision, tiny.average_precision)
    np.testing.assert_allclose(whole.ap_at_k, tiny.ap_at_k)


def test_leave_one_out_never_retrieves_self() -> None:
    features = np.eye(4)
    labels = np.array([0, 1, 2, 3])  # nobody has a positive besides itself
    scores = features @ features.T
    assert cmc_topk(scores, labels, labels, (1, 3), leave_one_out=True) == {1: 0.0, 3: 0.0}
    assert np.isnan(leave_one_out_map(scores, labels))


def test_cmc_rules_for_queries_without_positives() -> None:
    scores = np.array([[0.9, 0.1], [0.2, 0.8], [0.5, 0.4]])
    gallery_labels = np.array([0, 1])
    query_labels = np.array([0, 0, 7])  # query 2 has no positive
    assert cmc_topk(scores, query_labels, gallery_labels, (1, 2), no_positive="count-as-miss") == {
        1: pytest.approx(1 / 3),
        2: pytest.approx(2 / 3),
    }
    assert cmc_topk(scores, query_labels, gallery_labels, (1, 2), no_positive="exclude") == {
        1: 0.5,
        2: 1.0,
    }
    with pytest.raises(UserError, match="unknown rule"):
        cmc_topk(scores, query_labels, gallery_labels, (1,), no_positive="count-as-zero")


def test_rank_features_matches_score_matrix_path() -> None:
    rng = np.random.default_rng(3)
    q, g = rng.standard_normal((30, 8)), rng.standard_normal((70, 8))
    ql, gl = rng.integers(0, 5, 30), rng.integers(0, 5, 70)
    blocked = rank_features(
        q, g, ql, gl, similarity="euclidean", memory_bytes=1, dtype=torch.float64
    )
    distances = np.sqrt(((q[:, None, :] - g[None, :, :]) ** 2).sum(-1))
    direct = rank_queries(-distances, ql, gl)
    np.testing.assert_array_equal(blocked.first_hit, direct.first_hit)
    np.testing.assert_allclose(blocked.average_precision, direct.average_precision, atol=1e-12)


def test_rejects_nan_and_shape_mismatch() -> None:
    with pytest.raises(UserError, match="NaN"):
        mean_average_precision(np.array([[np.nan, 1.0]]), np.array([0]), np.array([0, 1]))
    with pytest.raises(UserError, match="labels"):
        mean_average_precision(np.zeros((2, 3)), np.array([0]), np.array([0, 1, 2]))


def test_gldv2_duplicates_keep_position_and_empty_prediction_counts_zero() -> None:
    # hits at positions 1 and 3; the duplicate at position 2 is not a second hit.
    value = gldv2_map_at_k([[5, 5, 6], []], [[5, 6], [1]], k=100)
    assert value == pytest.approx(((1 / 1 + 2 / 3) / 2 + 0.0) / 2)
    assert gldv2_map_at_k([[1, 2, 3]], [[3]], k=2) == 0.0  # truncated at k
    with pytest.raises(UserError, match="ground-truth"):
        gldv2_map_at_k([[1]], [[]])


def test_revisitop_trapezoid_ap_toy_and_junk_shift() -> None:
    assert revisitop_average_precision(np.array([0, 2, 5]), 3) == pytest.approx(0.677777, abs=1e-6)
    ranks = np.array([[10], [99], [11], [12], [13], [14], [15]])  # gallery 99 (junk) at position 1
    gnd = [{"ok": [10, 11, 14], "junk": [99]}]
    mean_ap, mp = revisitop_map(ranks, gnd, (1, 5))
    assert mean_ap == pytest.approx(revisitop_average_precision(np.array([0, 1, 4]), 3))
    # positives at 1-based 1, 2, 5: P@1 = 1; P@5 with kq = 5 is 3/5.
    np.testing.assert_allclose(mp, [1.0, 0.6])
    empty_mean, _ = revisitop_map(ranks, [{"ok": [], "junk": []}])
    assert np.isnan(empty_mean)


def test_roc_curve_matches_sklearn_with_ties() -> None:
    rng = np.random.default_rng(4)
    scores = np.round(rng.standard_normal(500), 1)
    labels = (rng.random(500) < 0.3).astype(int)
    for ours, theirs in zip(
        roc_curve(labels, scores), sklearn_roc_curve(labels, scores), strict=True
    ):
        np.testing.assert_array_equal(ours, theirs)


def test_tar_at_far_nearest_row_and_tie_rule() -> None:
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    labels = np.array([1, 0, 1, 0, 1, 0])
    fpr, tpr, _ = sklearn_roc_curve(labels, scores)
    # A target exactly between two FARs takes the higher one.
    target = (fpr[1] + fpr[2]) / 2 if fpr[1] != fpr[2] else fpr[1]
    expected = tpr[np.flatnonzero(np.isclose(np.abs(fpr - target), np.abs(fpr - target).min()))[-1]]
    assert tar_at_far(scores, labels, [target])[0] == expected
    with pytest.raises(UserError, match="both"):
        tar_at_far(scores, np.ones(6), [0.1])


def test_negative_flips() -> None:
    old = np.array([True, True, False, False])
    new = np.array([True, False, True, False])
    np.testing.assert_array_equal(negative_flips(old, new), [False, True, False, False])
    assert negative_flip_rate(old, new) == 0.25
    with pytest.raises(UserError):
        negative_flips(old, new[:3])


def test_dmu_deltas_are_relative_percentages() -> None:
    assert upgrade_gain(22.0, 20.0) == pytest.approx(10.0)
    assert degradation(24.0, 25.0) == pytest.approx(4.0)
    assert degradation(26.0, 25.0) == pytest.approx(-4.0)  # beats the oracle
    assert np.isnan(upgrade_gain(1.0, 0.0))


def test_compatibility_matrix_metrics_with_ties() -> None:
    m = np.array(
        [
            [0.50, 0.00, 0.00],
            [0.50, 0.60, 0.00],  # (1,0) ties M[0,0]
            [0.55, 0.58, 0.70],  # (2,1) below M[1,1]
        ]
    )
    assert average_compatibility(m, "lt") == pytest.approx(2 / 3)  # CoReS: tie is compatible
    assert average_compatibility(m, "le") == pytest.approx(1 / 3)  # iamcl2r: tie violates
    assert average_multimodel_accuracy(m) == pytest.approx(
        np.mean([0.5, 0.5, 0.6, 0.55, 0.58, 0.7])
    )
    assert backward_compatibility(m) == pytest.approx(((0.55 - 0.5) + (0.58 - 0.6)) / 2)
    assert forward_compatibility(m) == pytest.approx(((0.5 - 0.6) + (0.58 - 0.7)) / 2)
    assert set(compatibility_summary(m)) == {"ac_lt", "ac_le", "am", "bc", "fc"}
    with pytest.raises(UserError, match="square"):
        average_compatibility(np.zeros((2, 3)))


def test_average_compatibility_counts_the_measured_pairs_only() -> None:
    """A newer model of another dimension has no direct cell on an older gallery (NaN): it is no
    pair, neither compatible nor not; with no pair measured, AC is not a number."""
    nan = float("nan")
    m = np.array([[0.50, 0.0, 0.0], [nan, 0.60, 0.0], [0.55, 0.58, 0.70]])
    assert average_compatibility(m, "lt") == pytest.approx(1 / 2)  # (2,0) yes, (2,1) no
    assert np.isnan(average_compatibility(np.array([[0.5, 0.0], [nan, 0.6]])))
