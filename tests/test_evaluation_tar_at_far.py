"""TAR@FAR in the retrieval evaluator: the label-scored part of a (query set, gallery set) pair
scored as 1:1 verification, every (query, gallery item) pair one trial.

The embeddings are built so that the score matrix is exact and chosen by hand: with the inner
product, one-hot query vectors against gallery vectors that hold the scores column by column
give back exactly those scores.
"""

from __future__ import annotations

import numpy as np
import pydantic
import pytest

from modelupgrade.config import parse_params
from modelupgrade.config.errors import ParamsError
from modelupgrade.config.evaluation import EvaluationParams
from modelupgrade.errors import UserError
from modelupgrade.evaluation import EvaluationGroundTruth, RetrievalEvaluator, RevisitedSet
from modelupgrade.evaluation.cross_model import cross_model_matrix
from modelupgrade.evaluation.retrieval import tar_at_far_metric_name
from modelupgrade.metrics import TarAtFarAccumulator, tar_at_far

# Two queries (labels 0, 1) against four gallery items (labels 0, 1, 0, 1).
QUERY_LABELS = np.array([0, 1])
GALLERY_LABELS = np.array([0, 1, 0, 1])
SCORES = np.array(
    [
        [0.9, 0.8, 0.3, 0.1],
        [0.2, 0.7, 0.6, 0.5],
    ],
    dtype=np.float32,
)


def _evaluator(fars: list[float], **options: object) -> RetrievalEvaluator:
    params = EvaluationParams(similarity="inner", tar_at_far=fars, **options)
    return RetrievalEvaluator(params, QUERY_LABELS, GALLERY_LABELS, leave_one_out=False)


def _explicit_trials(
    scores: np.ndarray,
    query_labels: np.ndarray,
    gallery_labels: np.ndarray,
    leave_one_out: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, genuine 0/1) of every (query, gallery item) pair, written out one by one."""
    trial_scores, genuine = [], []
    for i, query_label in enumerate(query_labels):
        for j, gallery_label in enumerate(gallery_labels):
            if leave_one_out and i == j:
                continue
            trial_scores.append(scores[i, j])
            genuine.append(int(query_label == gallery_label))
    return np.array(trial_scores), np.array(genuine)


@pytest.mark.parametrize(
    ("fars", "expected"),
    [
        ([0.1, 0.25, 0.5], [0.25, 0.5, 1.0]),
        # Alone, FAR 0.1 keeps only the two best impostors: the pruned path of the accumulator.
        ([0.1], [0.25]),
    ],
)
def test_tar_at_far_is_the_hand_computed_roc_reading_and_tar_at_far_of_the_trial_list(
    fars: list[float], expected: list[float]
) -> None:
    # Trials by score: 0.9 G, 0.8 I, 0.7 G, 0.6 I, 0.5 G, 0.3 G, 0.2 I, 0.1 I (4 genuine,
    # 4 impostor). ROC (FAR, TAR) after dropping the collinear points at 0.5 and 0.2:
    # (0, 0), (0, 1/4), (1/4, 1/4), (1/4, 2/4), (2/4, 2/4), (2/4, 1), (1, 1).
    # FAR 0.1 → nearest FAR 0, highest TAR there: 0.25. FAR 0.25 → 0.5. FAR 0.5 → 1.0.
    result = _evaluator(fars).evaluate(np.eye(2, dtype=np.float32), SCORES.T.copy())
    names = [tar_at_far_metric_name(far) for far in fars]
    got = [result.metrics[name] for name in names]
    assert got == expected
    trial_scores, genuine = _explicit_trials(SCORES, QUERY_LABELS, GALLERY_LABELS, False)
    assert got == tar_at_far(trial_scores, genuine, fars).tolist()
    # Beside the existing metrics, and named as metric_names says.
    assert {"top1", "top5", "mAP", *names} == set(result.metrics)
    assert _evaluator(fars).metric_names() == ["top1", "top5", "mAP", *names]


def test_leave_one_out_never_counts_a_query_against_itself() -> None:
    # Items 0, 1 carry label 0 and items 2, 3 label 1; inner products of these 2-d vectors:
    #       0  1  2  3
    #   0 [ 4  2  0  2 ]
    #   1 [ 2  2  2  1 ]
    #   2 [ 0  2  4  0 ]
    #   3 [ 2  1  0  1 ]
    # Off the diagonal: genuine {2, 2, 0, 0}, impostor {2, 2, 2, 2, 1, 1, 0, 0}. ROC points
    # (0, 0), (4/8, 2/4), (6/8, 2/4), (1, 1): TAR@FAR 0.1 = 0, TAR@FAR 0.5 = 0.5. Counting the
    # self pairs (genuine 4, 2, 4, 1) would give 0.25 and 0.625.
    items = np.array([[2, 0], [1, 1], [0, 2], [1, 0]], dtype=np.float32)
    labels = np.array([0, 0, 1, 1])
    fars = [0.1, 0.5]
    params = EvaluationParams(similarity="inner", tar_at_far=fars)
    result = RetrievalEvaluator(params, labels, labels, leave_one_out=True).evaluate(items, items)
    got = [result.metrics[tar_at_far_metric_name(far)] for far in fars]
    assert got == [0.0, 0.5]
    scores = items @ items.T
    assert got == tar_at_far(*_explicit_trials(scores, labels, labels, True), fars).tolist()
    with_self = tar_at_far(*_explicit_trials(scores, labels, labels, False), fars).tolist()
    assert with_self == [0.25, 0.625]


def test_no_fars_means_no_tar_metrics() -> None:
    evaluator = _evaluator([])
    result = evaluator.evaluate(np.eye(2, dtype=np.float32), SCORES.T.copy())
    assert not [name for name in result.metrics if name.startswith("TAR")]
    assert not [name for name in evaluator.metric_names() if name.startswith("TAR")]
    assert evaluator.protocol_description()["TAR@FAR"] is None
    assert EvaluationParams().tar_at_far == []


@pytest.mark.parametrize("far", [0.0, 1.0, -1e-3, 1.5, float("nan")])
def test_a_far_outside_zero_one_is_a_validation_error_naming_the_key(far: float) -> None:
    with pytest.raises(pydantic.ValidationError, match="strictly between 0 and 1"):
        EvaluationParams(tar_at_far=[1e-3, far])
    raw = {
        "scenarios": {},
        "architectures": {"default": {}},
        "strategies": {"independent": {"kind": "independent"}},
        "sequential": {"strategies": []},
        "evaluation": {"tar_at_far": [far]},
    }
    with pytest.raises(ParamsError, match=r"evaluation\.tar_at_far: .*strictly between 0 and 1"):
        parse_params(raw)


def test_a_far_listed_twice_is_a_validation_error() -> None:
    with pytest.raises(pydantic.ValidationError, match="more than once"):
        EvaluationParams(tar_at_far=[1e-3, 0.001])


def test_metric_names_tell_every_far_apart() -> None:
    assert tar_at_far_metric_name(1e-3) == "TAR@FAR=1e-03"
    assert tar_at_far_metric_name(1e-4) == "TAR@FAR=1e-04"
    assert tar_at_far_metric_name(1.5e-3) == "TAR@FAR=1.5e-03"
    assert tar_at_far_metric_name(0.1) == "TAR@FAR=1e-01"


def test_revisited_rows_take_no_part_in_the_verification_trials() -> None:
    rng = np.random.default_rng(7)
    # Rows 0-3 of the queries and 0-7 of the gallery are label-scored; query row 4 and gallery
    # rows 8, 9 form a revisited set. Their labels equal the others' so that, were they
    # counted, they would add genuine trials.
    query = rng.integers(-3, 4, (5, 3)).astype(np.float32)
    gallery = rng.integers(-3, 4, (10, 3)).astype(np.float32)
    query_labels = np.array([0, 1, 0, 1, 0])
    gallery_labels = np.array([0, 1, 0, 1, 0, 1, 0, 1, 0, 0])
    revisited = RevisitedSet(
        "roxford5k",
        query_rows=np.array([4]),
        gallery_rows=np.array([8, 9]),
        easy=(np.array([0]),),
        hard=(np.array([], dtype=np.int64),),
        junk=(np.array([], dtype=np.int64),),
    )
    truth = EvaluationGroundTruth((revisited,), np.arange(4), np.arange(8))
    fars = [0.05, 0.2, 0.4]
    params = EvaluationParams(similarity="inner", tar_at_far=fars)
    evaluator = RetrievalEvaluator(
        params, query_labels, gallery_labels, leave_one_out=False, ground_truth=truth
    )
    result = evaluator.evaluate(query, gallery)
    got = [result.metrics[tar_at_far_metric_name(far)] for far in fars]
    label_part = tar_at_far(
        *_explicit_trials(query[:4] @ gallery[:8].T, query_labels[:4], gallery_labels[:8], False),
        fars,
    )
    assert got == label_part.tolist()
    everything = tar_at_far(
        *_explicit_trials(query @ gallery.T, query_labels, gallery_labels, False), fars
    )
    assert got != everything.tolist()
    assert "roxford5k/medium/mAP" in result.metrics


def test_tar_at_far_reaches_the_cross_model_matrix() -> None:
    evaluator = _evaluator([0.25])
    query_sets = {"old": np.eye(2, dtype=np.float32)}
    gallery_sets = {"old": SCORES.T.copy()}
    result = cross_model_matrix(evaluator, query_sets, gallery_sets, [("old", "old")])
    assert result.value("old", "old", "TAR@FAR=2.5e-01") == 0.5
    assert "TAR@FAR=2.5e-01" in result.wide().columns


@pytest.mark.parametrize("seed", range(4))
def test_the_accumulator_equals_tar_at_far_on_random_trials_with_ties(seed: int) -> None:
    """Streamed in blocks of random sizes (float32 and float64 mixed), keeping only the top
    impostors, the result is exactly ``tar_at_far`` of all trials."""
    rng = np.random.default_rng(seed)
    pruned = 0
    for _ in range(300):
        n = int(rng.integers(2, 300))
        # Rounding to 0-2 decimals makes many ties, within and across genuine and impostor.
        scores = np.round(rng.standard_normal(n), int(rng.integers(0, 3))).astype(np.float32)
        genuine = rng.random(n) < rng.uniform(0.02, 0.9)
        if genuine.all() or not genuine.any():
            continue
        num_impostors = int((~genuine).sum())
        fars = rng.uniform(0, 1, int(rng.integers(1, 4))) ** rng.uniform(1, 4)
        # FARs at exactly half an impostor count put 2·FAR·N on an integer (the boundary).
        halves = rng.integers(1, num_impostors + 1, 2) / (2 * num_impostors)
        fars = np.unique(np.r_[fars, halves])
        fars = fars[(fars > 0) & (fars < 1)]
        if not len(fars):
            continue
        expected = tar_at_far(scores, genuine.astype(int), fars)
        accumulator = TarAtFarAccumulator(fars, num_impostors)
        cuts = np.sort(rng.integers(0, n, int(rng.integers(0, 5))))
        for block in np.split(np.arange(n), cuts):
            block_scores = scores[block].astype(rng.choice([np.float32, np.float64]))
            accumulator.add(block_scores[genuine[block]], block_scores[~genuine[block]])
        pruned += bool(np.isfinite(accumulator.cutoff))
        np.testing.assert_array_equal(accumulator.result(), expected)
    assert pruned > 100  # the tail-only path is what is under test


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_the_evaluator_equals_tar_at_far_of_all_pairs_over_several_query_blocks(
    leave_one_out: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(3)
    # Small integer vectors: their inner products are exact in float32 whatever the blocking.
    gallery = rng.integers(-3, 4, (300, 6)).astype(np.float32)
    gallery_labels = rng.integers(0, 4, 300)
    query, query_labels = (
        (gallery, gallery_labels)
        if leave_one_out
        else (rng.integers(-3, 4, (70, 6)).astype(np.float32), rng.integers(0, 4, 70))
    )
    # Blocks of 7 queries: several blocks, the last one short, each with its own diagonal.
    monkeypatch.setattr(
        "modelupgrade.evaluation.retrieval.query_block_size", lambda *args, **kwargs: 7
    )
    fars = [1e-3, 1e-2, 0.1]
    params = EvaluationParams(similarity="inner", tar_at_far=fars)
    evaluator = RetrievalEvaluator(params, query_labels, gallery_labels, leave_one_out)
    got = evaluator.evaluate(query, gallery).metrics
    expected = tar_at_far(
        *_explicit_trials(query @ gallery.T, query_labels, gallery_labels, leave_one_out), fars
    )
    assert [got[tar_at_far_metric_name(far)] for far in fars] == expected.tolist()


def test_nan_scores_are_refused_rather_than_ranked() -> None:
    with pytest.raises(UserError, match="NaN"):
        tar_at_far(np.array([0.3, np.nan, 0.1]), np.array([1, 0, 0]), [0.5])
    with pytest.raises(UserError, match="NaN"):
        TarAtFarAccumulator([0.5], 2).add(np.array([0.3]), np.array([np.nan, 0.1]))


def test_the_accumulator_refuses_a_wrong_impostor_count() -> None:
    accumulator = TarAtFarAccumulator([0.5], 3)
    accumulator.add(np.array([0.3]), np.array([0.2, 0.1]))
    with pytest.raises(UserError, match="2 impostor trials were added, 3 announced"):
        accumulator.result()
