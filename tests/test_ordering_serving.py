"""The shared vocabulary of a backfill: ordering policies, score kinds, serving
modes, ranking rule."""

from __future__ import annotations

import numpy as np
import pytest

from modelupgrade.errors import UserError
from modelupgrade.ordering import ORDERINGS, SCORE_KINDS, OrderingInputs, build_ordering, softmax
from modelupgrade.retrieval import RankedPart, merged_topk, orderable
from modelupgrade.serving import SERVING_MODES, Forms, Pairing, build_serving_mode


def inputs(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return OrderingInputs(
        n=n,
        old_logits=rng.normal(size=(n, 6)) * 3,
        sigma2=rng.random(n),
        old_state_vectors=rng.normal(size=(n, 4)),
        new_vectors=rng.normal(size=(n, 4)),
        old_state_in_new_space=True,
    )


def is_permutation(order, n):
    return np.array_equal(np.sort(order), np.arange(n))


def test_random_order_is_a_permutation_drawn_from_the_seed_alone():
    policy = build_ordering("random")
    a, b = policy.order(40, seed=7), policy.order(40, seed=7)
    assert is_permutation(a, 40) and np.array_equal(a, b)
    assert not np.array_equal(a, policy.order(40, seed=8))
    # The simulator's path (scores computed from its arrays) draws the very same order.
    np.testing.assert_array_equal(policy.order_items(inputs(), seed=7), a)
    # The documented rule, so that any implementation of the store or the simulator can follow it.
    np.testing.assert_array_equal(
        a, np.argsort(-np.random.default_rng(7).random(40), kind="stable")
    )


def test_old_confidence_backfills_least_confident_first():
    given = inputs()
    order = build_ordering("old-confidence").order_items(given)
    confidence = softmax(given.old_logits).max(axis=1)[order]
    assert is_permutation(order, given.n) and np.all(np.diff(confidence) >= 0)


def test_old_entropy_backfills_most_uncertain_prediction_first():
    given = inputs()
    p = softmax(given.old_logits)
    entropy = -(p * np.log(p)).sum(1)
    order = build_ordering("old-entropy").order_items(given)
    assert np.all(np.diff(entropy[order]) <= 1e-12)
    same = build_ordering("old-entropy").order_items(OrderingInputs(n=given.n, old_probabilities=p))
    np.testing.assert_array_equal(order, same)


def test_confidence_and_entropy_are_different_scores_read_in_opposite_directions():
    policy_c, policy_e = build_ordering("old-confidence"), build_ordering("old-entropy")
    assert (policy_c.score, policy_c.descending) == ("old-confidence", False)
    assert (policy_e.score, policy_e.descending) == ("old-entropy", True)
    # Fed the confidence values as if they were entropies, the entropy policy backfills the most
    # confident items first: a store must never hand one policy another's score.
    confidence = np.array([0.9, 0.2, 0.5])
    assert policy_e.order(3, confidence).tolist() == [0, 2, 1]
    assert policy_c.order(3, confidence).tolist() == [1, 2, 0]


def test_fastfill_order_is_descending_sigma2_and_ties_keep_gallery_order():
    given = inputs()
    order = build_ordering("fastfill-uncertainty").order_items(given)
    assert np.all(np.diff(given.sigma2[order]) <= 0)
    assert build_ordering("fastfill-uncertainty").order(
        4, np.array([1.0, 2.0, 1.0, 2.0])
    ).tolist() == [1, 3, 0, 2]


def test_oracle_order_is_descending_alignment_error_and_not_deployable():
    given = inputs()
    policy = build_ordering("oracle")
    error = np.linalg.norm(given.new_vectors - given.old_state_vectors, axis=1)
    assert np.all(np.diff(error[policy.order_items(given)]) <= 0)
    assert policy.deployable is False and SCORE_KINDS["alignment-error"].deployable is False
    assert all(build_ordering(name).deployable for name in ORDERINGS.names() if name != "oracle")
    narrower = OrderingInputs(
        n=40,
        new_vectors=given.new_vectors,
        old_state_vectors=given.new_vectors[:, :2],
        old_state_in_new_space=True,
    )
    assert not policy.available(narrower)
    # Same width, but spaces never aligned (an independent model without ψ): no order.
    unrelated = OrderingInputs(
        n=40, new_vectors=given.new_vectors, old_state_vectors=given.old_state_vectors
    )
    assert not policy.available(unrelated)
    with pytest.raises(UserError, match="new space"):
        policy.order_items(unrelated)


def test_policies_without_their_inputs_are_unavailable_and_refuse():
    bare = OrderingInputs(n=10)
    for name in ("old-confidence", "old-entropy", "fastfill-uncertainty", "oracle"):
        policy = build_ordering(name)
        assert not policy.available(bare)
        with pytest.raises(UserError, match="needs"):
            policy.order_items(bare)
        with pytest.raises(UserError, match="was not given"):
            policy.order(10)
        with pytest.raises(UserError, match="finite"):
            policy.order(3, np.array([1.0, np.nan, 2.0]))
    with pytest.raises(UserError, match="unknown backfill ordering policy"):
        build_ordering("nope")


def test_serving_modes_pair_the_documented_forms():
    every = Forms.of(
        ["new", "old", "reverse", "rho", "rho_reverse"], ["stored", "forward", "new", "rho"]
    )
    expected = {
        "mixed": (Pairing("new", "forward"), Pairing("new", "new")),
        "rank-merge": (Pairing("old", "stored"), Pairing("new", "new")),
        "rank-merge-rqt": (Pairing("reverse", "stored"), Pairing("new", "new")),
        "rank-merge-full": (Pairing("rho_reverse", "stored"), Pairing("rho", "rho")),
    }
    assert set(SERVING_MODES.names()) == set(expected)
    for name, (old_part, new_part) in expected.items():
        plan = build_serving_mode(name).plan(every)
        assert (plan.old_part, plan.new_part) == (old_part, new_part)
    # Without a forward head the mixed index serves the stored vectors themselves.
    plain = build_serving_mode("mixed").plan(Forms.of(["new"], ["stored", "new"]))
    assert plain.old_part == Pairing("new", "stored") and plain.one_index
    # Rank merge needs the old model's query vectors; without them it is unavailable, not mixed.
    with pytest.raises(UserError, match="both models"):
        build_serving_mode("rank-merge").plan(Forms.of(["new", "reverse"], ["stored", "new"]))


def test_ranking_rule_is_distance_then_new_side_then_index():
    values = np.array(
        [-3.5, -0.0, 0.0, 1e-30, 2.0, np.float32(2.0) + np.float32(2e-7)], dtype=np.float32
    )
    assert np.all(np.diff(orderable(values).astype(np.int64)) >= 0)
    tied = np.array([[0.5, 0.5]], dtype=np.float32)
    old = RankedPart(tied, np.array([0, 1]), "old")
    new = RankedPart(tied, np.array([7, 3]), "new")
    top = merged_topk([old, new], k=4, queries=1)
    assert top.columns.tolist() == [[3, 7, 0, 1]] and top.old_side.tolist() == [
        [False, False, True, True]
    ]
    assert merged_topk([old, new], k=1, queries=1).columns.tolist() == [[3]]
    empty = merged_topk([], k=3, queries=2)
    assert empty.columns.shape == (2, 0)
