"""The papers' claims on hand-made results whose verdicts are known by construction.

One scenario holds every number a claim reads (``HOLDING``: each claim holds on them). Each claim
then meets numbers that contradict it (does not hold), a NaN among its numbers (not tested: NaN is
"not measured", never a loss) and its numbers left out (not tested). The results are built as the
typed summaries ``check_claims`` reads (``ScenarioEvaluation``, ``BackfillSummary`` and the tidy
curves table), not through the files, so each number is in one place.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from modelupgrade.backfill.summary import BackfillSummary, CurveSummary, check_conditions
from modelupgrade.evaluation.summary import ComparisonRow, ScenarioEvaluation
from modelupgrade.report import check_claims
from modelupgrade.report.results import ScenarioResults, StudyResults

NAN = float("nan")
CLAIM_COUNT = 7
# The claims in ``CLAIMS`` order, by what they are about.
(
    BCT_BACKWARD_COMPATIBLE,
    BCT_LOSES_NEW_TO_NEW,
    DMU_NARROWS_BCT_LOSS,
    FORWARD_ADAPTERS_RAISE,
    REVERSE_TRANSFORMS_BEAT_NAIVE,
    RANK_MERGE_MONOTONE,
    UNCERTAINTY_BEATS_RANDOM,
) = range(CLAIM_COUNT)

# Every number the claims read; None leaves its row or curve out. On these, each claim holds.
HOLDING: dict[str, Any] = {
    "old_self": 0.40,  # M(old, old)
    "oracle_self": 0.70,  # M(independent, independent)
    "bct_backward": 0.45,  # M(BCT, old) > M(old, old)
    "bct_self": 0.66,  # M(BCT, BCT) < the independent model's
    "bct_delta_down": 5.71,  # Δ↓ of BCT > Δ↓ of DMU
    "dmu_delta_down": 1.43,
    "dmu_backward": 0.50,
    "independent_forward": 0.45,  # M(independent, ψ(old)) > M(old, old): FCT's reference
    "dmu_forward": 0.55,  # M(DMU, ψ(old)) > M(DMU, old)
    "reverse_half_way": 0.55,  # RQT rank merge at t = 0.5 > the naive two-model merge
    "naive_half_way": 0.45,
    "rank_merge_points": (0.40, 0.45, 0.70),  # the rank-merge curve: non-decreasing
    "uncertainty_auc": 0.60,  # FastFill's σ² order > the random order
    "random_auc": 0.52,
}

# For each claim, numbers that contradict it, all else as in HOLDING.
CONTRADICTING: dict[int, dict[str, Any]] = {
    BCT_BACKWARD_COMPATIBLE: {"bct_backward": 0.39},
    BCT_LOSES_NEW_TO_NEW: {"bct_self": 0.72},
    DMU_NARROWS_BCT_LOSS: {"dmu_delta_down": 6.0},
    FORWARD_ADAPTERS_RAISE: {"dmu_forward": 0.48},
    REVERSE_TRANSFORMS_BEAT_NAIVE: {"reverse_half_way": 0.44},
    RANK_MERGE_MONOTONE: {"rank_merge_points": (0.40, 0.50, 0.45, 0.70)},
    UNCERTAINTY_BEATS_RANDOM: {"uncertainty_auc": 0.50},
}

# For each claim, NaN in place of numbers it needs, so that none of its checks was measured.
NOT_MEASURED: dict[int, dict[str, Any]] = {
    BCT_BACKWARD_COMPATIBLE: {"bct_backward": NAN},
    BCT_LOSES_NEW_TO_NEW: {"oracle_self": NAN},
    DMU_NARROWS_BCT_LOSS: {"dmu_delta_down": NAN},
    FORWARD_ADAPTERS_RAISE: {"independent_forward": NAN, "dmu_forward": NAN},
    REVERSE_TRANSFORMS_BEAT_NAIVE: {"naive_half_way": NAN},
    # A NaN point of the curve: check_conditions makes it not monotone, with a NaN largest drop.
    RANK_MERGE_MONOTONE: {"rank_merge_points": (0.40, NAN, 0.70)},
    UNCERTAINTY_BEATS_RANDOM: {"random_auc": NAN},
}

# For each claim, its numbers left out, and what its evidence then says.
LEFT_OUT: dict[int, tuple[dict[str, Any], str]] = {
    BCT_BACKWARD_COMPATIBLE: ({"bct_backward": None}, "BCT was not evaluated"),
    BCT_LOSES_NEW_TO_NEW: (
        {"oracle_self": None},
        "BCT or the independent model was not evaluated",
    ),
    DMU_NARROWS_BCT_LOSS: ({"dmu_delta_down": None}, "BCT or DMU was not evaluated"),
    FORWARD_ADAPTERS_RAISE: (
        {"independent_forward": None, "dmu_forward": None},
        "no forward head was evaluated",
    ),
    REVERSE_TRANSFORMS_BEAT_NAIVE: (
        {"reverse_half_way": None},
        "no reverse transform was simulated",
    ),
    RANK_MERGE_MONOTONE: ({"rank_merge_points": None}, "no rank-merge curve was simulated"),
    UNCERTAINTY_BEATS_RANDOM: ({"uncertainty_auc": None}, "no FastFill adapter was simulated"),
}


# -- hand-made results -----------------------------------------------------------------------------


def comparison(
    kind: str, query: str, gallery: str, value: float, delta_down: float = 0.0
) -> ComparisonRow:
    return ComparisonRow(
        comparison=kind,
        query_set=query,
        gallery_set=gallery,
        metric="mAP",
        value=value,
        delta_up_pct=0.0,
        delta_down_pct=delta_down,
        negative_flip_rate=NAN,
    )


def evaluation(numbers: dict[str, Any]) -> ScenarioEvaluation:
    """The cross-model evaluation: old gen0, new models of the independent, BCT and DMU kinds."""

    def present(*rows: tuple[str, str, str, float | None, float]) -> list[ComparisonRow]:
        return [comparison(*row) for row in rows if row[3] is not None]

    rows = {
        "independent": present(
            ("self", "gen1-independent", "gen1-independent", 0.70, 0.0),
            ("backward", "gen1-independent", "gen0", 0.02, 0.0),
            (
                "forward-head",
                "gen1-independent",
                "fct-independent(gen0)",
                numbers["independent_forward"],
                0.0,
            ),
        ),
        "bct": present(
            ("self", "gen1-bct", "gen1-bct", numbers["bct_self"], numbers["bct_delta_down"]),
            ("backward", "gen1-bct", "gen0", numbers["bct_backward"], numbers["bct_delta_down"]),
        ),
    }
    if numbers["dmu_delta_down"] is not None:  # None: no DMU model at all
        rows["dmu"] = present(
            ("self", "gen1-dmu", "gen1-dmu", 0.69, numbers["dmu_delta_down"]),
            ("backward", "gen1-dmu", "gen0", numbers["dmu_backward"], 0.0),
            ("forward-head", "gen1-dmu", "dmu(gen0)", numbers["dmu_forward"], 0.0),
        )
    return ScenarioEvaluation(
        scenario="sc",
        protocol={"name": "sampled"},
        headline_metric="mAP",
        old_model="gen0",
        oracle="gen1-independent",
        device="cpu",
        strategies=rows,
        old_self=numbers["old_self"],
        oracle_self=numbers["oracle_self"],
    )


def curve_summary(
    strategy: str, policy: str, mode: str, auc: float, points: tuple[float, ...] = (0.4, 0.7)
) -> CurveSummary:
    metric = {"mAP": auc}
    return CurveSummary(
        strategy=strategy,
        policy=policy,
        mode=mode,
        deployable=True,
        auc_mean=metric,
        auc_trapezoid=metric,
        # As simulate_backfill derives them from the curve's points.
        conditions={"mAP": check_conditions(list(points), old_old=0.40, new_new=0.70)},
        start={"mAP": points[0]},
        end={"mAP": points[-1]},
        start_single_system={"mAP": points[0]},
        end_single_system={"mAP": points[-1]},
        endpoints_match=True,
        max_negative_flip_rate=0.0,
        new_new={"mAP": 0.70},
    )


def backfill(numbers: dict[str, Any]) -> BackfillSummary:
    curves = [curve_summary("bct", "random", "mixed", 0.50)]
    if numbers["reverse_half_way"] is not None:
        curves.append(curve_summary("rqt-independent", "random", "rank-merge-rqt", 0.58))
    if numbers["rank_merge_points"] is not None:
        points = numbers["rank_merge_points"]
        curves.append(curve_summary("independent", "random", "rank-merge", 0.48, points))
    # The oracle order is not deployable: its non-monotone curve is not the claim's business.
    oracle_order = curve_summary("independent", "oracle", "rank-merge", 0.62, (0.4, 0.8, 0.7))
    curves.append(oracle_order.model_copy(update={"deployable": False}))
    if numbers["uncertainty_auc"] is not None:
        curves += [
            curve_summary("fastfill-independent", "random", "mixed", numbers["random_auc"]),
            curve_summary(
                "fastfill-independent", "fastfill-uncertainty", "mixed", numbers["uncertainty_auc"]
            ),
        ]
    return BackfillSummary(
        scenario="sc",
        protocol="query-gallery",
        distance="cosine",
        grid={"kind": "uniform", "t": [0.0, 0.5, 1.0], "cutoffs": [0, 50, 100]},
        gallery_size=100,
        queries=20,
        old_old={"mAP": 0.40},
        primary_auc="auc_trapezoid",
        curves=curves,
        skipped=[],
        policies_known=["random"],
        serving_modes_known=["mixed"],
    )


def curves_table(numbers: dict[str, Any]) -> pd.DataFrame:
    """The tidy backfill curves the reverse-transform claim reads at t = 0.5."""
    curves = {
        ("independent", "rank-merge"): numbers["naive_half_way"],
        ("rqt-independent", "rank-merge-rqt"): numbers["reverse_half_way"],
    }
    return pd.DataFrame(
        [
            {"strategy": strategy, "policy": "random", "mode": mode, "t": t, "mAP": value}
            for (strategy, mode), half_way in curves.items()
            if half_way is not None
            for t, value in ((0.0, 0.40), (0.5, half_way), (1.0, 0.70))
        ],
        columns=["strategy", "policy", "mode", "t", "mAP"],
    )


def scenario(name: str = "sc", **changes: Any) -> ScenarioResults:
    numbers = {**HOLDING, **changes}
    return ScenarioResults(
        name=name,
        evaluation=evaluation(numbers),
        backfill=backfill(numbers),
        heatmap=None,
        curves_plot=None,
        curves=curves_table(numbers),
        head_systems={f"{head}-independent": "independent" for head in ("fct", "rqt", "fastfill")},
    )


def study(*scenarios: ScenarioResults) -> StudyResults:
    return StudyResults(
        list(scenarios),
        strategy_kinds={"independent": "independent", "bct": "bct", "dmu": "dmu"},
    )


def verdicts(results: StudyResults) -> list[str]:
    return [claim.verdict for claim in check_claims(results)]


def all_hold_but(claim: int, verdict: str) -> list[str]:
    return [verdict if i == claim else "holds" for i in range(CLAIM_COUNT)]


# -- the verdicts ----------------------------------------------------------------------------------


def test_every_claim_holds_on_the_numbers_made_to_hold() -> None:
    claims = check_claims(study(scenario()))
    assert [c.verdict for c in claims] == ["holds"] * CLAIM_COUNT
    assert all(c.holds is True for c in claims)
    assert [c.evidence for c in claims] == [
        "sc: M(BCT, old) = 0.4500 vs M(old, old) = 0.4000",
        "sc: M(BCT, BCT) = 0.6600 vs independent 0.7000",
        "sc: Δ↓ DMU 1.43% vs BCT 5.71%",
        (
            "sc: M(gen1-independent, fct-independent(gen0)) = 0.4500 vs M(old, old) = 0.4000; "
            "sc: M(gen1-dmu, dmu(gen0)) = 0.5500 vs M(dmu, old) = 0.5000"
        ),
        "sc: rqt-independent rank merge at t = 0.5: mAP 0.5500 vs naive two-model merge 0.4500",
        "sc independent/random: monotone",
        "sc fastfill-independent: AUC mAP σ² order 0.6000 vs random 0.5200",
    ]


@pytest.mark.parametrize("claim", sorted(CONTRADICTING))
def test_a_claim_its_numbers_contradict_does_not_hold(claim: int) -> None:
    claims = check_claims(study(scenario(**CONTRADICTING[claim])))
    assert [c.verdict for c in claims] == all_hold_but(claim, "does not hold")
    assert claims[claim].holds is False


def test_the_contradicting_numbers_are_the_evidence() -> None:
    # Ties do not hold: each claim is a strict inequality.
    tie = check_claims(study(scenario(bct_backward=0.40)))[BCT_BACKWARD_COMPATIBLE]
    assert (tie.holds, tie.evidence) == (False, "sc: M(BCT, old) = 0.4000 vs M(old, old) = 0.4000")
    drop = check_claims(study(scenario(**CONTRADICTING[RANK_MERGE_MONOTONE])))
    assert drop[RANK_MERGE_MONOTONE].evidence == "sc independent/random: largest drop 0.0500"


@pytest.mark.parametrize("claim", sorted(NOT_MEASURED))
def test_a_nan_input_leaves_a_claim_not_tested_never_failed(claim: int) -> None:
    claims = check_claims(study(scenario(**NOT_MEASURED[claim])))
    assert [c.verdict for c in claims] == all_hold_but(claim, "not tested")
    assert claims[claim].holds is None
    assert "not measured" in claims[claim].evidence  # the reader sees which number was missing


@pytest.mark.parametrize("claim", sorted(LEFT_OUT))
def test_a_claim_whose_numbers_are_left_out_is_not_tested(claim: int) -> None:
    changes, why = LEFT_OUT[claim]
    claims = check_claims(study(scenario(**changes)))
    assert [c.verdict for c in claims] == all_hold_but(claim, "not tested")
    assert (claims[claim].holds, claims[claim].evidence) == (None, why)


def test_a_nan_check_is_left_out_and_the_claim_stands_on_the_measured_ones() -> None:
    # M(old, old) NaN: FCT's check of the independent model (against old/old) is not measured; the
    # DMU adapter's (against M(DMU, old)) is, and holds, so the forward claim holds on it alone.
    claims = check_claims(study(scenario(old_self=NAN)))
    assert [c.verdict for c in claims] == all_hold_but(BCT_BACKWARD_COMPATIBLE, "not tested")
    forward = claims[FORWARD_ADAPTERS_RAISE].evidence.split("; ")
    assert "not measured" in forward[0] and forward[1] == (
        "sc: M(gen1-dmu, dmu(gen0)) = 0.5500 vs M(dmu, old) = 0.5000"
    )
    # …and a measured check that fails still fails the claim beside a NaN one.
    failing = study(scenario(old_self=NAN, dmu_forward=0.48))
    assert verdicts(failing)[FORWARD_ADAPTERS_RAISE] == "does not hold"


def test_across_scenarios_a_nan_one_neither_carries_nor_blocks_the_verdict() -> None:
    measured, unmeasured = scenario("measured"), scenario("unmeasured", bct_backward=NAN)
    compatible = check_claims(study(unmeasured, measured))[BCT_BACKWARD_COMPATIBLE]
    assert compatible.verdict == "holds"
    assert compatible.evidence == (
        "unmeasured: M(BCT, old) = nan vs M(old, old) = 0.4000 (not measured); "
        "measured: M(BCT, old) = 0.4500 vs M(old, old) = 0.4000"
    )
    contradicted = scenario("measured", bct_backward=0.39)
    assert verdicts(study(unmeasured, contradicted))[BCT_BACKWARD_COMPATIBLE] == "does not hold"
    assert verdicts(study(unmeasured))[BCT_BACKWARD_COMPATIBLE] == "not tested"


def test_a_study_without_scenarios_tests_nothing() -> None:
    assert verdicts(study()) == ["not tested"] * CLAIM_COUNT


def test_inf_is_a_measured_number_not_a_missing_one() -> None:
    # Only NaN means "not measured"; an infinite Δ↓ (a zero reference) still compares.
    claims = check_claims(study(scenario(bct_delta_down=math.inf)))
    assert claims[DMU_NARROWS_BCT_LOSS].verdict == "holds"
