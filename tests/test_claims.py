"""The papers' claims on hand-made results whose verdicts are known by construction.

One scenario, of a kind in every claim's scope (extended-class), holds every number a claim reads
(``HOLDING``: each claim holds on them). Each claim then meets numbers that contradict it (fails),
a NaN among its numbers (not tested: NaN is "not measured", never a loss) and its numbers left out
(not tested). Scenarios of other kinds show the scopes: a claim is judged only on the scenario kinds
its paper reports it for. The results are built as the typed summaries ``check_claims`` reads
(``ScenarioEvaluation`` and ``BackfillSummary``), not through the files, so each number is in one
place.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from modelupgrade.backfill.summary import BackfillSummary, CurveSummary, check_conditions
from modelupgrade.evaluation.summary import ComparisonRow, Convergence, ScenarioEvaluation
from modelupgrade.report import Claim, check_claims
from modelupgrade.report.claims import CLAIMS
from modelupgrade.report.results import ScenarioResults, StudyResults

NAN = float("nan")
CLAIM_COUNT = 11
# The claims in ``CLAIMS`` order, by what they are about.
(
    BCT_BACKWARD_COMPATIBLE,
    BCT_LOSES_NEW_TO_NEW,
    DMU_BEATS_BCT,
    FORWARD_ADAPTERS_RAISE,
    FULL_METHOD_BEATS_NAIVE,
    RANK_MERGE_MONOTONE,
    UNCERTAINTY_BEATS_RANDOM,
    FASTFILL_BEATS_FCT,
    FASTFILL_LOSS_BEATS_FCT,
    DRIFT_ADAPTER_RECOVERS,
    SLERP_BACKWARD_COMPATIBLE,
) = range(CLAIM_COUNT)
# Seeds of the hand-made studies whose verdicts are known by construction.
SEEDS = 5
# The backfill study's queries: one query's worth of mAP or top-1 is 1/QUERIES.
QUERIES = 100
TOLERANCE = 1 / QUERIES

# Every number the claims read; None leaves its row or curve out. On these, each claim holds.
HOLDING: dict[str, Any] = {
    # M(old, old): the old model reaches 91 % of the new one's M, a pair of comparable quality
    # (Drift-Adapter's premise).
    "old_self": 0.64,
    "oracle_self": 0.70,  # M(independent, independent)
    "bct_backward": 0.66,  # M(BCT, old) > M(old, old)
    "bct_self": 0.66,  # M(BCT, BCT) < the independent model's
    "bct_delta_up": 12.5,  # Δ↑ of BCT (backward) < Δ↑ of DMU (its best: through ψ)
    "dmu_delta_up": 25.0,
    "dmu_forward_delta_up": 37.5,
    "bct_delta_down": 5.71,  # Δ↓ of BCT > Δ↓ of DMU
    "dmu_delta_down": 1.43,
    "dmu_backward": 0.68,  # M(DMU, old) > M(old, old): DMU's model is compatible
    "independent_forward": 0.66,  # M(independent, ψ(old)) > M(old, old): FCT's reference
    "dmu_forward": 0.69,  # M(DMU, ψ(old)) > max(M(DMU, old), M(old, old))
    # Seo et al.'s full method vs the naive rank merge, AUC under the old-confidence order.
    "full_auc": 0.58,
    "full_top1_auc": 0.66,
    "naive_auc": 0.48,
    "naive_top1_auc": 0.60,
    # The naive rank merge's curve (old-confidence order): non-decreasing in mAP and top-1.
    "rank_merge_points": (0.40, 0.45, 0.70),
    "rank_merge_top1_points": (0.50, 0.60, 0.80),
    "uncertainty_auc": 0.60,  # FastFill's σ² order > the random order, mAP and top-1
    "uncertainty_top1_auc": 0.75,
    "random_auc": 0.52,
    "random_top1_auc": 0.70,
    # FCT's adapter on the same new model, random order: below FastFill's in either order.
    "fct_random_auc": 0.50,
    "fct_random_top1_auc": 0.68,
    # Query-side training-free adapters of the independent model, M(adapter(new), old), fitted on
    # 3000 pairs: the best Drift-Adapter kind recovers ≥ 95 % of M(independent, independent) =
    # 0.70; SLERP beats M(old, old) and Procrustes alone. The residual MLP on 300 pairs is not
    # the largest sample: the claims do not read it.
    "procrustes_query": 0.67,
    "affine_query": 0.60,
    "residual_query": 0.68,
    "residual_query_small": 0.69,
    "slerp_query": 0.685,
    # Models and heads that failed the convergence gate (by the evaluation's names).
    "unconverged": (),
}

# For each claim, numbers that contradict it, all else as in HOLDING.
CONTRADICTING: dict[int, dict[str, Any]] = {
    BCT_BACKWARD_COMPATIBLE: {"bct_backward": 0.63},
    BCT_LOSES_NEW_TO_NEW: {"bct_self": 0.72},
    DMU_BEATS_BCT: {"dmu_delta_down": 6.0},
    FORWARD_ADAPTERS_RAISE: {"dmu_forward": 0.67},
    FULL_METHOD_BEATS_NAIVE: {"full_auc": 0.44},
    RANK_MERGE_MONOTONE: {"rank_merge_points": (0.40, 0.50, 0.45, 0.70)},
    UNCERTAINTY_BEATS_RANDOM: {"uncertainty_auc": 0.51},
    # FastFill's σ² order above its random one, which is above FCT's: FCT above FastFill's σ²
    # order is above its random order too (ALSO_FAILS).
    FASTFILL_BEATS_FCT: {"fct_random_auc": 0.62},
    FASTFILL_LOSS_BEATS_FCT: {"fct_random_auc": 0.55},
    DRIFT_ADAPTER_RECOVERS: {"procrustes_query": 0.64, "residual_query": 0.62},
    SLERP_BACKWARD_COMPATIBLE: {"slerp_query": 0.66},
}

# For each claim, NaN in place of numbers it needs, so that none of its checks was measured.
NOT_MEASURED: dict[int, dict[str, Any]] = {
    BCT_BACKWARD_COMPATIBLE: {"bct_backward": NAN},
    BCT_LOSES_NEW_TO_NEW: {"oracle_self": NAN},
    DMU_BEATS_BCT: {"dmu_delta_down": NAN, "dmu_delta_up": NAN, "dmu_forward_delta_up": NAN},
    FORWARD_ADAPTERS_RAISE: {"independent_forward": NAN, "dmu_forward": NAN},
    FULL_METHOD_BEATS_NAIVE: {"naive_auc": NAN, "naive_top1_auc": NAN},
    # A NaN point of the curve: check_conditions makes it not monotone, with a NaN largest drop.
    RANK_MERGE_MONOTONE: {
        "rank_merge_points": (0.40, NAN, 0.70),
        "rank_merge_top1_points": (0.50, NAN, 0.80),
    },
    UNCERTAINTY_BEATS_RANDOM: {"random_auc": NAN, "random_top1_auc": NAN},
    FASTFILL_BEATS_FCT: {"fct_random_auc": NAN, "fct_random_top1_auc": NAN},
    FASTFILL_LOSS_BEATS_FCT: {"fct_random_auc": NAN, "fct_random_top1_auc": NAN},
    DRIFT_ADAPTER_RECOVERS: {"procrustes_query": NAN, "affine_query": NAN, "residual_query": NAN},
    SLERP_BACKWARD_COMPATIBLE: {"slerp_query": NAN},
}

FASTFILL_WITHOUT_FCT = (
    "no FastFill adapter was simulated beside an FCT adapter on the same new model"
)
# For each claim, its numbers left out, and what its evidence then says.
LEFT_OUT: dict[int, tuple[dict[str, Any], str]] = {
    BCT_BACKWARD_COMPATIBLE: ({"bct_backward": None}, "BCT was not evaluated"),
    BCT_LOSES_NEW_TO_NEW: (
        {"oracle_self": None},
        "BCT or the independent model was not evaluated",
    ),
    DMU_BEATS_BCT: ({"dmu_delta_down": None}, "BCT or DMU was not evaluated"),
    FORWARD_ADAPTERS_RAISE: (
        {"independent_forward": None, "dmu_forward": None},
        "no forward head was evaluated",
    ),
    FULL_METHOD_BEATS_NAIVE: (
        {"full_auc": None},
        "no full rank-merge system (rm_full head) was simulated",
    ),
    RANK_MERGE_MONOTONE: (
        {"rank_merge_points": None},
        "no rank-merge curve of the independent model was simulated",
    ),
    UNCERTAINTY_BEATS_RANDOM: ({"uncertainty_auc": None}, "no FastFill adapter was simulated"),
    FASTFILL_BEATS_FCT: ({"fct_random_auc": None}, FASTFILL_WITHOUT_FCT),
    FASTFILL_LOSS_BEATS_FCT: ({"fct_random_auc": None}, FASTFILL_WITHOUT_FCT),
    DRIFT_ADAPTER_RECOVERS: (
        {
            "procrustes_query": None,
            "affine_query": None,
            "residual_query": None,
            "residual_query_small": None,
        },
        "no query-side Drift-Adapter kind was fitted (adapters.scenarios, adapters.heads)",
    ),
    SLERP_BACKWARD_COMPATIBLE: (
        {"slerp_query": None},
        "no SLERP query adapter was fitted (adapters.scenarios, adapters.heads)",
    ),
}
# The naive rank merge's curve is also the full method's reference: leaving it out leaves both
# claims untested.
# FastFill's two claims against FCT read the same FCT curve; the σ² order's claim reads FastFill's
# σ² curve as FastFill's whole method does.
FASTFILL_AGAINST_FCT = {FASTFILL_BEATS_FCT, FASTFILL_LOSS_BEATS_FCT}
ALSO_LEFT_OUT = {
    RANK_MERGE_MONOTONE: {FULL_METHOD_BEATS_NAIVE},
    UNCERTAINTY_BEATS_RANDOM: FASTFILL_AGAINST_FCT,
    FASTFILL_BEATS_FCT: FASTFILL_AGAINST_FCT,
    FASTFILL_LOSS_BEATS_FCT: FASTFILL_AGAINST_FCT,
}
ALSO_NOT_MEASURED = {
    UNCERTAINTY_BEATS_RANDOM: {FASTFILL_LOSS_BEATS_FCT},
    FASTFILL_BEATS_FCT: FASTFILL_AGAINST_FCT,
    FASTFILL_LOSS_BEATS_FCT: FASTFILL_AGAINST_FCT,
}
ALSO_FAILS = {FASTFILL_BEATS_FCT: FASTFILL_AGAINST_FCT}
# A claim's record in claims.json, in this order (``holds`` beside ``verdict`` for old readers).
CLAIM_RECORD_KEYS = [
    "statement",
    "source",
    "scope",
    "paper",
    "ours",
    "seeds",
    "verdict",
    "holds",
    "checks",
    "evidence",
]


# -- hand-made results -----------------------------------------------------------------------------


def comparison(
    kind: str, query: str, gallery: str, value: float, up: float = 0.0, down: float = 0.0
) -> ComparisonRow:
    return ComparisonRow(
        comparison=kind,
        query_set=query,
        gallery_set=gallery,
        metric="mAP",
        value=value,
        delta_up_pct=up,
        delta_down_pct=down,
        negative_flip_rate=NAN,
    )


def evaluation(numbers: dict[str, Any]) -> ScenarioEvaluation:
    """The cross-model evaluation: old gen0, new models of the independent, BCT and DMU kinds."""

    def present(*rows: tuple[str, str, str, float | None, float, float]) -> list[ComparisonRow]:
        return [comparison(*row) for row in rows if row[3] is not None]

    bct_down, bct_up = numbers["bct_delta_down"], numbers["bct_delta_up"]
    # Query-side adapters: (number key, head kind, fitted head name, sample size).
    adapters = [
        ("procrustes_query", "procrustes_query", "procrustes_query.all", 3000),
        ("affine_query", "affine_query", "affine_query.all", 3000),
        ("residual_query_small", "residual_mlp_query", "residual_mlp_query.n300", 300),
        ("residual_query", "residual_mlp_query", "residual_mlp_query.all", 3000),
        ("slerp_query", "slerp_query", "slerp_query.all", 3000),
    ]
    rows = {
        "independent": present(
            ("self", "gen1-independent", "gen1-independent", 0.70, NAN, 0.0),
            ("backward", "gen1-independent", "gen0", 0.02, -95.0, 0.0),
            (
                "forward-head",
                "gen1-independent",
                "fct-independent(gen0)",
                numbers["independent_forward"],
                12.5,
                0.0,
            ),
            *(
                (
                    "reverse-adapter",
                    f"{name}-independent(gen1-independent)",
                    "gen0",
                    numbers[key],
                    0.0,
                    0.0,
                )
                for key, _, name, _ in adapters
            ),
        ),
        "bct": present(
            ("self", "gen1-bct", "gen1-bct", numbers["bct_self"], NAN, bct_down),
            ("backward", "gen1-bct", "gen0", numbers["bct_backward"], bct_up, bct_down),
        ),
    }
    dmu_down = numbers["dmu_delta_down"]
    if dmu_down is not None:  # None: no DMU model at all
        rows["dmu"] = present(
            ("self", "gen1-dmu", "gen1-dmu", 0.69, NAN, dmu_down),
            ("backward", "gen1-dmu", "gen0", numbers["dmu_backward"], numbers["dmu_delta_up"], 0.0),
            (
                "forward-head",
                "gen1-dmu",
                "dmu-dmu(gen0)",
                numbers["dmu_forward"],
                numbers["dmu_forward_delta_up"],
                0.0,
            ),
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
        sources={
            f"{name}-independent": {"kind": kind, "sample_size": size}
            for _, kind, name, size in adapters
        },
        # The systems named in "unconverged" failed the convergence gate.
        convergence={
            name: Convergence(
                kind="head" if "-" in name and not name.startswith("gen") else "model",
                statistics={"prototype_accuracy": 0.2},
                passed=False,
                reasons=["nearest-prototype accuracy 0.20 on its training images (gate ≥ 0.80)"],
            )
            for name in numbers["unconverged"]
        },
    )


def curve_summary(
    strategy: str,
    policy: str,
    mode: str,
    auc: float,
    top1_auc: float | None = None,
    points: tuple[float, ...] = (0.4, 0.7),
    top1_points: tuple[float, ...] = (0.5, 0.8),
) -> CurveSummary:
    """A curve's summary; its AUC is the same by either rule (FastFill's mean, the trapezoid)."""
    aucs = {"mAP": auc, "top1": auc if top1_auc is None else top1_auc}
    return CurveSummary(
        strategy=strategy,
        policy=policy,
        mode=mode,
        deployable=True,
        auc_mean=aucs,
        auc_trapezoid=aucs,
        # As simulate_backfill derives them from the curve's points.
        conditions={
            "mAP": check_conditions(list(points), old_old=0.40, new_new=0.70),
            "top1": check_conditions(list(top1_points), old_old=0.50, new_new=0.80),
        },
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
    if numbers["full_auc"] is not None:
        curves.append(
            curve_summary(
                "rm_full-independent",
                "old-confidence",
                "rank-merge-full",
                numbers["full_auc"],
                numbers["full_top1_auc"],
            )
        )
    if numbers["rank_merge_points"] is not None:
        curves.append(
            curve_summary(
                "independent",
                "old-confidence",
                "rank-merge",
                numbers["naive_auc"],
                numbers["naive_top1_auc"],
                numbers["rank_merge_points"],
                numbers["rank_merge_top1_points"],
            )
        )
    # Not the monotone claim's business: the oracle order is not deployable, the entropy order is
    # not Seo et al.'s, and BCT's new model is not RM_naive's independently trained one.
    dips = (0.4, 0.8, 0.7)
    oracle_order = curve_summary("independent", "oracle", "rank-merge", 0.62, points=dips)
    curves += [
        oracle_order.model_copy(update={"deployable": False}),
        curve_summary("independent", "old-entropy", "rank-merge", 0.50, points=dips),
        curve_summary("bct", "old-confidence", "rank-merge", 0.50, points=dips),
    ]
    if numbers["uncertainty_auc"] is not None:
        curves += [
            curve_summary(
                "fastfill-independent",
                "random",
                "mixed",
                numbers["random_auc"],
                numbers["random_top1_auc"],
            ),
            curve_summary(
                "fastfill-independent",
                "fastfill-uncertainty",
                "mixed",
                numbers["uncertainty_auc"],
                numbers["uncertainty_top1_auc"],
            ),
        ]
    if numbers["fct_random_auc"] is not None:
        curves.append(
            curve_summary(
                "fct-independent",
                "random",
                "mixed",
                numbers["fct_random_auc"],
                numbers["fct_random_top1_auc"],
            )
        )
    return BackfillSummary(
        scenario="sc",
        protocol="query-gallery",
        distance="cosine",
        grid={"kind": "uniform", "t": [0.0, 0.5, 1.0], "cutoffs": [0, 50, 100]},
        gallery_size=100,
        queries=QUERIES,
        old_old={"mAP": 0.40},
        primary_auc="auc_trapezoid",
        curves=curves,
        skipped=[],
        policies_known=["random"],
        serving_modes_known=["mixed"],
    )


def scenario(name: str = "sc", kind: str = "extended-class", **changes: Any) -> ScenarioResults:
    numbers = {**HOLDING, **changes}
    heads = ("fct", "rqt", "fastfill", "rm_full")
    return ScenarioResults(
        name=name,
        kind=kind,
        evaluation=evaluation(numbers),
        backfill=backfill(numbers),
        heatmap=None,
        curves_plot=None,
        head_systems={f"{head}-independent": "independent" for head in heads},
        head_kinds={f"{head}-independent": head for head in heads},
    )


def study(*scenarios: ScenarioResults) -> StudyResults:
    return StudyResults(
        list(scenarios),
        strategy_kinds={"independent": "independent", "bct": "bct", "dmu": "dmu"},
    )


def judged(results: StudyResults, seeds: int = SEEDS) -> list[Claim]:
    """The claims on ``results`` repeated over ``seeds`` training seeds: every margin the same on
    each, so each check's sign decides its verdict (no spread: p = 0)."""
    return check_claims(results, [results] * (seeds - 1))


def verdicts(results: StudyResults) -> list[str]:
    return [claim.verdict for claim in judged(results)]


def all_hold_but(claims: int | set[int], verdict: str) -> list[str]:
    others = {claims} if isinstance(claims, int) else claims
    return [verdict if i in others else "holds" for i in range(CLAIM_COUNT)]


# -- the registry ----------------------------------------------------------------------------------


def test_each_claim_names_its_source_scope_and_the_papers_numbers() -> None:
    claims = judged(study(scenario()))
    assert len(CLAIMS) == CLAIM_COUNT
    for claim in claims:
        assert claim.statement and claim.source and claim.scope.scenarios
        assert claim.scope.metric and claim.scope.protocol and claim.scope.elsewhere
        assert set(claim.scope.scenarios) <= {
            "extended-data",
            "open-data",
            "extended-class",
            "open-class",
            "identical-data",
        }
        assert claim.seeds == SEEDS
    assert claims[DMU_BEATS_BCT].source == "DMU (Table 1)"
    assert "19.18 vs 11.57" in claims[DMU_BEATS_BCT].paper
    assert claims[BCT_BACKWARD_COMPATIBLE].scope.scenarios == (
        "extended-data",
        "open-data",
        "extended-class",
    )
    assert "UniBCT (Table 4)" in claims[BCT_BACKWARD_COMPATIBLE].scope.elsewhere
    assert claims[RANK_MERGE_MONOTONE].paper is None  # Seo et al. show figures only
    assert "44.84 vs 42.05" in claims[UNCERTAINTY_BEATS_RANDOM].paper
    assert "53.4 vs 40.0" in claims[FULL_METHOD_BEATS_NAIVE].paper
    assert "arXiv 2509.23471" in claims[DRIFT_ADAPTER_RECOVERS].source
    assert "95–99 %" in claims[DRIFT_ADAPTER_RECOVERS].paper
    assert "text embeddings" in claims[DRIFT_ADAPTER_RECOVERS].scope.protocol
    assert "85/90" in claims[SLERP_BACKWARD_COMPATIBLE].paper


def test_the_json_form_of_a_claim() -> None:
    claim = judged(study(scenario()))[BCT_BACKWARD_COMPATIBLE]
    record = claim.as_dict()
    assert list(record) == CLAIM_RECORD_KEYS
    assert record["scope"]["scenarios"] == ["extended-data", "open-data", "extended-class"]
    assert (record["ours"], record["seeds"], record["verdict"]) == (
        "sc: 0.6600 ± 0.0000 vs 0.6400 ± 0.0000",
        SEEDS,
        "holds",
    )
    (check,) = record["checks"]
    assert check == {
        "check": "sc: M(BCT, old) vs M(old, old)",
        "seeds": SEEDS,
        "seeds_left_out": 0,
        "mean": pytest.approx([0.66, 0.64]),
        "sd": [0.0, 0.0],
        "difference_mean": pytest.approx(0.02),
        "difference_sd": 0.0,
        "difference_ci95": pytest.approx([0.02, 0.02]),
        "query_bootstrap_se": None,  # no per-query file behind these hand-made numbers
        "t": None,  # the same margin on every seed: no spread, t infinite (not strict JSON)
        "p": 0.0,
        "p_holm": 0.0,
        "verdict": "holds",
    }
    json.dumps(record, allow_nan=False)  # claims.json is strict JSON


# -- the rules: a paired t-test over seeds, Holm's correction within a claim ----------------------


def seeds_of(*backward: float, **numbers: Any) -> list[StudyResults]:
    """One study per seed: M(BCT, old) as given on each, M(old, old) 0.64 on all."""
    return [study(scenario(bct_backward=value, **numbers)) for value in backward]


def bct_claim(seeds: list[StudyResults]) -> Claim:
    return check_claims(seeds[0], seeds[1:])[BCT_BACKWARD_COMPATIBLE]


def test_a_paired_t_test_over_the_seeds_decides_a_check() -> None:
    # Margins over M(old, old) = 0.64: 0.02, 0.03, 0.01, 0.02, 0.02: mean 0.02, sd 0.00707,
    # t = 0.02 / (0.00707 / √5) = 6.32 on 4 degrees of freedom, two-sided p = 0.0032.
    holds = bct_claim(seeds_of(0.66, 0.67, 0.65, 0.66, 0.66))
    assert (holds.verdict, holds.seeds) == ("holds", 5)
    (check,) = holds.as_dict()["checks"]
    assert check["t"] == pytest.approx(6.3246, abs=1e-4)
    assert check["p"] == pytest.approx(0.003208, abs=1e-5)
    assert check["p_holm"] == check["p"]  # one check: nothing to correct
    assert check["difference_ci95"] == pytest.approx([0.02 - 0.00878, 0.02 + 0.00878], abs=1e-4)
    # The study's own seed's text, its numbers now mean ± sd over the seeds.
    assert holds.ours == "sc: 0.6600 ± 0.0071 vs 0.6400 ± 0.0000"
    assert holds.evidence.startswith(
        "sc: M(BCT, old) vs M(old, old): 0.6600 ± 0.0071 vs 0.6400 ± 0.0000 over 5 of 5 seeds, "
        "difference +0.0200 ± 0.0071 (seeds' sd); paired t = 6.32, p = 0.003, Holm-adjusted "
        "p = 0.003: holds. The study's own seed: sc: M(BCT, old) = 0.6600 vs M(old, old) = 0.6400"
    )


def test_fails_only_where_the_interval_excludes_the_papers_direction() -> None:
    # Significantly below: the 95 % interval of the margin lies below zero.
    assert bct_claim(seeds_of(0.62, 0.61, 0.63, 0.62, 0.62)).verdict == "fails"
    # Below on average but within what the seeds' spread allows: inconclusive, not a failure.
    unsure = bct_claim(seeds_of(0.62, 0.66, 0.60, 0.65, 0.63))
    assert unsure.verdict == "inconclusive" and unsure.holds is None
    assert unsure.checks[0].test.mean < 0


def test_one_seed_or_too_few_seeds_give_no_verdict() -> None:
    # One seed is one draw: no test at all, whatever its sign.
    one = check_claims(study(scenario(bct_backward=0.70)))[BCT_BACKWARD_COMPATIBLE]
    assert one.verdict == "inconclusive"
    assert "one seed: no test" in one.evidence
    # Measured on two seeds of five (NaN elsewhere): below MIN_SEEDS, inconclusive.
    two = bct_claim(seeds_of(0.66, NAN, 0.67, NAN, NAN))
    assert (two.verdict, two.seeds) == ("inconclusive", 2)
    assert "over 2 of 5 seeds" in two.evidence
    # Three seeds measured it: tested on those three.
    assert bct_claim(seeds_of(0.66, NAN, 0.67, NAN, 0.665)).verdict == "holds"


def test_holms_correction_spans_a_claims_checks() -> None:
    # Scenario a alone: margins 0.004, 0.012, 0.001, 0.010, 0.005 (t = 3.18, p = 0.034 < 0.05):
    # it would hold. Beside scenario b (p = 0.59), Holm doubles a's p-value to 0.067:
    # inconclusive.
    def two_scenarios(first: float, second: float) -> StudyResults:
        return study(scenario("a", bct_backward=first), scenario("b", bct_backward=second))

    a = (0.644, 0.652, 0.641, 0.650, 0.645)
    b = (0.66, 0.63, 0.65, 0.62, 0.665)
    alone = bct_claim(seeds_of(*a))
    assert alone.verdict == "holds" and alone.as_dict()["checks"][0]["p"] == pytest.approx(
        0.03366, abs=1e-4
    )
    claim = bct_claim([two_scenarios(x, y) for x, y in zip(a, b, strict=True)])
    first, second = claim.as_dict()["checks"]
    assert first["p_holm"] == pytest.approx(2 * first["p"])
    assert second["p_holm"] == pytest.approx(max(first["p_holm"], second["p"]))
    assert (first["verdict"], second["verdict"], claim.verdict) == (
        "inconclusive",
        "inconclusive",
        "inconclusive",
    )
    # One check failing beyond doubt fails the claim, whatever the others.
    failed = [two_scenarios(x, 0.60) for x in a]
    assert bct_claim(failed).verdict == "fails"


def test_a_claim_resting_on_a_model_that_did_not_converge_is_not_tested() -> None:
    # BCT's model failed the convergence gate on every seed: its claims are not tested, never
    # failed, even where its numbers contradict them.
    stalled = judged(study(scenario(bct_backward=0.50, unconverged=("gen1-bct",))))
    compatible = stalled[BCT_BACKWARD_COMPATIBLE]
    assert compatible.verdict == "not tested (anchor model did not converge)"
    assert compatible.holds is None
    assert "anchor model did not converge" in compatible.evidence
    # The old model anchors every claim (the compatible models are trained against it).
    anchored = judged(study(scenario(unconverged=("gen0",))))
    assert all(c.verdict.startswith("not tested") for c in anchored)
    # A head that did not train leaves its part of a claim untested; what remains cannot carry
    # the whole claim to "holds".
    partly = judged(study(scenario(unconverged=("dmu-dmu",))))[FORWARD_ADAPTERS_RAISE]
    assert partly.verdict == "inconclusive"
    # On one seed of five: that seed is left out, the rest are tested.
    seeds = seeds_of(0.66, 0.67, 0.65, 0.66, 0.66)
    seeds[2] = study(scenario(bct_backward=0.30, unconverged=("gen1-bct",)))
    claim = bct_claim(seeds)
    assert (claim.verdict, claim.seeds) == ("holds", 4)
    assert "seed 3 left out: anchor model did not converge" in claim.evidence


# -- the verdicts ----------------------------------------------------------------------------------


def own_seed(claim: Claim) -> str:
    """The study's own seed's evidence of each check of a claim."""
    return "; ".join(check.draws[0].evidence for check in claim.checks)


def test_every_claim_holds_on_the_numbers_made_to_hold() -> None:
    claims = judged(study(scenario()))
    assert [c.verdict for c in claims] == ["holds"] * CLAIM_COUNT
    assert all(c.holds is True for c in claims)
    assert [own_seed(c) for c in claims] == [
        "sc: M(BCT, old) = 0.6600 vs M(old, old) = 0.6400",
        "sc: M(BCT, BCT) = 0.6600 vs independent 0.7000",
        "sc: Δ↑ DMU through ψ 37.50% vs BCT 12.50%; sc: Δ↓ DMU 1.43% vs BCT 5.71%",
        (
            "sc: M(gen1-independent, fct-independent(gen0)) = 0.6600 vs M(old, old) = 0.6400; "
            "sc: M(gen1-dmu, dmu-dmu(gen0)) = 0.6900 vs M(dmu, old) = 0.6800"
        ),
        (
            "sc rm_full-independent: AUC mAP 0.5800 vs naive rank merge 0.4800; "
            "sc rm_full-independent: AUC top1 0.6600 vs naive rank merge 0.6000"
        ),
        (
            "sc independent/old-confidence mAP: largest dip 0.0000 (tolerance 0.0100, one "
            "query's worth); sc independent/old-confidence top1: largest dip 0.0000 (tolerance "
            "0.0100, one query's worth)"
        ),
        (
            "sc fastfill-independent: mean mAP σ² order 0.6000 vs random 0.5200; "
            "sc fastfill-independent: mean top1 σ² order 0.7500 vs random 0.7000"
        ),
        (
            "sc fastfill-independent: mean mAP σ² order 0.6000 vs FCT random 0.5000; "
            "sc fastfill-independent: mean top1 σ² order 0.7500 vs FCT random 0.6800"
        ),
        (
            "sc fastfill-independent: mean mAP random 0.5200 vs FCT random 0.5000; "
            "sc fastfill-independent: mean top1 random 0.7000 vs FCT random 0.6800"
        ),
        (
            "sc: best query-side adapter residual_mlp_query.all-independent M = 0.6800 vs "
            "M(independent, independent) = 0.7000: 97.1 % on 3000 pairs, 66.7 % of the gap from "
            "M(old, old) = 0.6400 closed (each kind: procrustes_query 95.7 %, affine_query "
            "85.7 %, residual_mlp_query 97.1 %)"
        ),
        (
            "sc: M(slerp_query.all-independent, old) = 0.6850 vs M(old, old) = 0.6400; "
            "sc: M(slerp_query.all-independent, old) = 0.6850 vs "
            "M(procrustes_query.all-independent, old) = 0.6700 (3000 pairs)"
        ),
    ]
    assert [c.ours for c in claims] == [
        "sc: 0.6600 ± 0.0000 vs 0.6400 ± 0.0000",
        "sc: 0.6600 ± 0.0000 vs 0.7000 ± 0.0000",
        "sc: Δ↑ 37.50 ± 0.00 vs 12.50 ± 0.00%; sc: Δ↓ 1.43 ± 0.00 vs 5.71 ± 0.00%",
        (
            "sc fct-independent(gen0): 0.6600 ± 0.0000 vs 0.6400 ± 0.0000; "
            "sc dmu-dmu(gen0): 0.6900 ± 0.0000 vs 0.6800 ± 0.0000"
        ),
        "sc: mAP 0.5800 ± 0.0000 vs 0.4800 ± 0.0000; sc: top1 0.6600 ± 0.0000 vs 0.6000 ± 0.0000",
        (
            "sc independent/old-confidence mAP dip 0.0000 ± 0.0000; "
            "sc independent/old-confidence top1 dip 0.0000 ± 0.0000"
        ),
        "sc: mAP 0.6000 ± 0.0000 vs 0.5200 ± 0.0000; sc: top1 0.7500 ± 0.0000 vs 0.7000 ± 0.0000",
        "sc: mAP 0.6000 ± 0.0000 vs 0.5000 ± 0.0000; sc: top1 0.7500 ± 0.0000 vs 0.6800 ± 0.0000",
        "sc: mAP 0.5200 ± 0.0000 vs 0.5000 ± 0.0000; sc: top1 0.7000 ± 0.0000 vs 0.6800 ± 0.0000",
        "sc: 97.1 ± 0.0 % (residual_mlp_query, 3000 pairs; 66.7 ± 0.0 % of the old→new gap)",
        (
            "sc: 0.6850 ± 0.0000 vs old 0.6400 ± 0.0000; "
            "sc: 0.6850 ± 0.0000 vs Procrustes 0.6700 ± 0.0000"
        ),
    ]


def test_the_claims_premises_narrow_what_is_tested() -> None:
    # The forward-adapter claim for a compatible model rests on its being compatible: DMU's model
    # below M(old, old) leaves its ψ check out (not failed), and FCT's check carries the claim.
    incompatible = judged(study(scenario(dmu_backward=0.60, dmu_forward=0.62)))
    forward = incompatible[FORWARD_ADAPTERS_RAISE]
    assert forward.verdict == "holds"
    assert "premise: M(dmu, old) 0.6000 ≤ M(old, old) 0.6400" in forward.evidence
    # ψ must beat the better of M(new, old) and M(old, old): here M(DMU, old) 0.68.
    below = judged(study(scenario(dmu_forward=0.67)))[FORWARD_ADAPTERS_RAISE]
    assert below.verdict == "fails"
    # Drift-Adapter's claim needs an old model comparable to the new one (≥ 90 % of its M).
    weak_old = judged(study(scenario(old_self=0.40, bct_backward=0.45)))[DRIFT_ADAPTER_RECOVERS]
    assert weak_old.verdict.startswith("not tested (premise: the old model reaches 57.1 %")


@pytest.mark.parametrize("claim", sorted(CONTRADICTING))
def test_a_claim_its_numbers_contradict_fails(claim: int) -> None:
    claims = judged(study(scenario(**CONTRADICTING[claim])))
    assert [c.verdict for c in claims] == all_hold_but(
        {claim} | ALSO_FAILS.get(claim, set()), "fails"
    )
    assert claims[claim].holds is False


def test_the_contradicting_numbers_are_the_evidence() -> None:
    # A tie on every seed is no evidence either way: inconclusive, never holds.
    tie = judged(study(scenario(bct_backward=0.64)))[BCT_BACKWARD_COMPATIBLE]
    assert (tie.verdict, own_seed(tie)) == (
        "inconclusive",
        "sc: M(BCT, old) = 0.6400 vs M(old, old) = 0.6400",
    )
    drop = judged(study(scenario(**CONTRADICTING[RANK_MERGE_MONOTONE])))
    assert own_seed(drop[RANK_MERGE_MONOTONE]).startswith(
        "sc independent/old-confidence mAP: largest dip 0.0500 (tolerance 0.0100, one query's "
        "worth)"
    )


# -- DMU: Δ↑ as well as Δ↓ -------------------------------------------------------------------------


def test_dmu_fails_on_a_smaller_gain_even_with_the_smaller_loss() -> None:
    claims = judged(study(scenario(dmu_delta_up=10.0, dmu_forward_delta_up=11.0)))
    assert [c.verdict for c in claims] == all_hold_but(DMU_BEATS_BCT, "fails")
    assert own_seed(claims[DMU_BEATS_BCT]) == (
        "sc: Δ↑ DMU through ψ 11.00% vs BCT 12.50%; sc: Δ↓ DMU 1.43% vs BCT 5.71%"
    )


def test_dmus_gain_is_its_best_new_to_old_search_and_bcts_its_backward_one() -> None:
    # DMU's tables fold ψ into new-to-old: its backward Δ↑ alone below BCT's does not fail it.
    dmu = judged(study(scenario(dmu_delta_up=10.0)))[DMU_BEATS_BCT]
    assert dmu.holds is True and "Δ↑ DMU through ψ 37.50%" in dmu.evidence
    # Without ψ, its backward search is its gain.
    backward = judged(study(scenario(dmu_forward_delta_up=NAN)))[DMU_BEATS_BCT]
    assert backward.holds is True and "Δ↑ DMU 25.00% vs BCT 12.50%" in backward.evidence


# -- rank merge: a tolerance of one query, mAP and top-1 -------------------------------------------


@pytest.mark.parametrize(
    ("points", "top1_points", "verdict"),
    [
        ((0.40, 0.45 + 1e-9, 0.45, 0.70), (0.50, 0.60, 0.80), "holds"),  # numerical noise
        ((0.40, 0.45 + TOLERANCE, 0.45, 0.70), (0.50, 0.60, 0.80), "holds"),  # one query
        ((0.40, 0.45 + 1.1 * TOLERANCE, 0.45, 0.70), (0.50, 0.60, 0.80), "fails"),
        ((0.40, 0.45, 0.70), (0.50, 0.62, 0.60, 0.80), "fails"),  # top-1 dips by two queries
        ((0.40, 0.45, 0.70), (0.50, 0.60 + 1e-9, 0.60, 0.80), "holds"),
    ],
)
def test_a_rank_merge_dip_counts_only_beyond_one_querys_worth(
    points: tuple[float, ...], top1_points: tuple[float, ...], verdict: str
) -> None:
    numbers = {"rank_merge_points": points, "rank_merge_top1_points": top1_points}
    claims = judged(study(scenario(**numbers)))
    assert [c.verdict for c in claims] == all_hold_but(RANK_MERGE_MONOTONE, verdict)


def test_a_top1_dip_fails_the_monotone_claim_and_is_named() -> None:
    claim = judged(study(scenario(rank_merge_top1_points=(0.50, 0.62, 0.60, 0.80))))[
        RANK_MERGE_MONOTONE
    ]
    assert claim.verdict == "fails"
    assert own_seed(claim).endswith(
        "sc independent/old-confidence top1: largest dip 0.0200 (tolerance 0.0100, one query's "
        "worth)"
    )
    assert claim.ours == (
        "sc independent/old-confidence mAP dip 0.0000 ± 0.0000; "
        "sc independent/old-confidence top1 dip 0.0200 ± 0.0000"
    )


def test_a_dip_counts_only_beyond_the_query_noise_the_simulator_measured() -> None:
    # With the per-query noise kept, the tolerance is 1.96 standard errors of the dip: a 0.02
    # dip holds where its standard error is 0.015, and fails where it is 0.005.
    def with_se(se: float) -> Claim:
        sc = scenario(rank_merge_top1_points=(0.50, 0.62, 0.60, 0.80))
        assert sc.backfill is not None
        curves = [
            c.model_copy(
                update={
                    "conditions": {
                        m: cond.model_copy(update={"largest_drop_se": se})
                        for m, cond in c.conditions.items()
                    }
                }
            )
            for c in sc.backfill.curves
        ]
        sc.backfill = sc.backfill.model_copy(update={"curves": curves})
        return judged(study(sc))[RANK_MERGE_MONOTONE]

    assert with_se(0.015).verdict == "holds"
    noisy_free = with_se(0.005)
    assert noisy_free.verdict == "fails"
    assert "tolerance 0.0098, 1.96 × its query standard error" in own_seed(noisy_free)


# -- the scopes ------------------------------------------------------------------------------------


def test_a_claim_is_judged_only_on_the_scenario_kinds_of_its_scope() -> None:
    # BCT contradicted on open-class, which no paper reports BCT on: shown, not counted.
    outside = scenario("oc", kind="open-class", bct_backward=0.39)
    compatible = judged(study(scenario(), outside))[BCT_BACKWARD_COMPATIBLE]
    assert compatible.verdict == "holds"
    assert own_seed(compatible) == "sc: M(BCT, old) = 0.6600 vs M(old, old) = 0.6400"
    assert compatible.evidence.endswith(
        "Outside the paper's scope, not counted: oc: M(BCT, old) vs M(old, old): 0.3900 ± 0.0000 "
        "vs 0.6400 ± 0.0000 over 5 of 5 seeds, difference -0.2500 ± 0.0000 (seeds' sd); paired "
        "t = -inf, p < 0.001, Holm-adjusted p < 0.001: fails. The study's own seed: oc: "
        "M(BCT, old) = 0.3900 vs M(old, old) = 0.6400"
    )
    assert compatible.ours == "sc: 0.6600 ± 0.0000 vs 0.6400 ± 0.0000"
    # A study with scenarios outside the scope only tests nothing, and says so.
    claims = judged(study(scenario("ed", kind="extended-data")))
    assert [c.verdict for c in claims] == all_hold_but(
        {FULL_METHOD_BEATS_NAIVE, RANK_MERGE_MONOTONE, UNCERTAINTY_BEATS_RANDOM}
        | FASTFILL_AGAINST_FCT,
        "not tested",
    )
    fastfill = claims[UNCERTAINTY_BEATS_RANDOM]
    assert fastfill.evidence.startswith(
        "nothing measured on the paper's scope (extended-class). Outside the paper's scope, not "
        "counted: ed fastfill-independent: mean mAP σ² order vs random: 0.6000 ± 0.0000 vs "
        "0.5200 ± 0.0000 over 5 of 5 seeds"
    )
    assert fastfill.ours == (
        "outside the scope only: ed: mAP 0.6000 ± 0.0000 vs 0.5200 ± 0.0000 (+1 more)"
    )


def test_the_naive_rank_merge_is_the_independent_models_in_seo_et_als_orders() -> None:
    # The old-confidence order is checked; so is the random order, and nothing else.
    random_order = scenario()
    assert random_order.backfill is not None
    curves = [
        c.model_copy(update={"policy": "random"}) if c.mode == "rank-merge" else c
        for c in random_order.backfill.curves
    ]
    random_order.backfill = random_order.backfill.model_copy(update={"curves": curves})
    claim = judged(study(random_order))[RANK_MERGE_MONOTONE]
    assert claim.verdict == "fails"  # the entropy-order and BCT curves, now in random order, dip
    assert "sc independent/random mAP: largest dip 0.0000" in claim.evidence
    assert "sc bct/random" not in claim.evidence  # BCT's model is not RM_naive's


def test_many_checks_are_summarised_in_ours() -> None:
    failing = scenario("oc", kind="open-class", rank_merge_points=(0.40, 0.50, 0.45, 0.70))
    claim = judged(study(scenario(), failing))[RANK_MERGE_MONOTONE]
    assert claim.verdict == "fails"
    assert claim.ours == "3/4 hold; e.g. oc independent/old-confidence mAP dip 0.0500 ± 0.0000"
    held = judged(study(scenario(), scenario("oc", kind="open-class")))
    assert held[RANK_MERGE_MONOTONE].ours == "4/4 hold"


# -- not tested ------------------------------------------------------------------------------------


@pytest.mark.parametrize("claim", sorted(NOT_MEASURED))
def test_a_nan_input_leaves_a_claim_not_tested_never_failed(claim: int) -> None:
    claims = judged(study(scenario(**NOT_MEASURED[claim])))
    untested = {claim} | ALSO_NOT_MEASURED.get(claim, set())
    assert [c.verdict for c in claims] == all_hold_but(untested, "not tested")
    assert claims[claim].holds is None
    assert "not measured" in claims[claim].evidence  # the reader sees which number was missing
    assert claims[claim].ours is None


@pytest.mark.parametrize("claim", sorted(LEFT_OUT))
def test_a_claim_whose_numbers_are_left_out_is_not_tested(claim: int) -> None:
    changes, why = LEFT_OUT[claim]
    claims = judged(study(scenario(**changes)))
    untested = {claim} | ALSO_LEFT_OUT.get(claim, set())
    assert [c.verdict for c in claims] == all_hold_but(untested, "not tested")
    assert (claims[claim].holds, claims[claim].evidence, claims[claim].ours) == (None, why, None)


def test_a_nan_check_is_left_out_and_the_claim_stands_on_the_measured_ones() -> None:
    # M(old, old) NaN: every check against it is not measured (BCT's criterion, the forward
    # adapters' reference, Drift-Adapter's premise, SLERP against the old system); SLERP's check
    # against Procrustes is measured, holds, and carries its claim alone.
    claims = judged(study(scenario(old_self=NAN)))
    assert [c.verdict for c in claims] == all_hold_but(
        {BCT_BACKWARD_COMPATIBLE, FORWARD_ADAPTERS_RAISE}, "not tested"
    )[:DRIFT_ADAPTER_RECOVERS] + [
        "not tested (premise not measured: M(old, old) is missing)",
        "holds",
    ]
    slerp = claims[SLERP_BACKWARD_COMPATIBLE]
    lines = own_seed(slerp).split("; ")
    assert "= nan" in lines[0] and lines[1] == (
        "sc: M(slerp_query.all-independent, old) = 0.6850 vs "
        "M(procrustes_query.all-independent, old) = 0.6700 (3000 pairs)"
    )
    assert slerp.ours == "sc: 0.6850 ± 0.0000 vs Procrustes 0.6700 ± 0.0000; 1 not measured"
    # …and a measured check that fails still fails the claim beside a NaN one.
    failing = study(scenario(old_self=NAN, slerp_query=0.66))
    assert verdicts(failing)[SLERP_BACKWARD_COMPATIBLE] == "fails"


def test_across_scenarios_a_nan_one_neither_carries_nor_blocks_the_verdict() -> None:
    measured, unmeasured = scenario("measured"), scenario("unmeasured", bct_backward=NAN)
    compatible = judged(study(unmeasured, measured))[BCT_BACKWARD_COMPATIBLE]
    assert compatible.verdict == "holds"
    assert own_seed(compatible) == (
        "unmeasured: M(BCT, old) = nan vs M(old, old) = 0.6400; "
        "measured: M(BCT, old) = 0.6600 vs M(old, old) = 0.6400"
    )
    assert compatible.evidence.startswith(
        "unmeasured: M(BCT, old) vs M(old, old): not tested: not measured."
    )
    contradicted = scenario("measured", bct_backward=0.39)
    assert verdicts(study(unmeasured, contradicted))[BCT_BACKWARD_COMPATIBLE] == "fails"
    assert verdicts(study(unmeasured))[BCT_BACKWARD_COMPATIBLE] == "not tested"


def test_a_study_without_scenarios_tests_nothing() -> None:
    assert verdicts(study()) == ["not tested"] * CLAIM_COUNT


def test_inf_is_a_measured_number_not_a_missing_one() -> None:
    # Only NaN means "not measured"; an infinite Δ↓ (a zero reference) still compares.
    claims = judged(study(scenario(bct_delta_down=math.inf)))
    assert claims[DMU_BEATS_BCT].verdict == "holds"


# -- the seed table --------------------------------------------------------------------------------


def test_the_seed_table_says_where_the_new_model_is_no_clear_upgrade() -> None:
    from modelupgrade.report.build import seed_blocks
    from modelupgrade.report.document import render_markdown

    def seed(clear_new: float, unclear_new: float) -> StudyResults:
        return study(
            scenario("clear", old_self=0.40, oracle_self=clear_new),
            scenario("unclear", old_self=0.40, oracle_self=unclear_new),
        )

    # Gains 0.30, 0.32, 0.28 (mean 0.30, sd 0.02) and 0.05, -0.05, 0.03 (mean 0.01, sd 0.053).
    seeds = [seed(0.70, 0.45), seed(0.72, 0.35), seed(0.68, 0.43)]
    text = render_markdown("t", seed_blocks(seeds))
    # A paired t-test of the gains: t = 25.98 (p = 0.001), and t = 0.33 (p = 0.775).
    assert "| clear | 0.400 ± 0.000 | 0.700 ± 0.020 | +0.300 ± 0.020 | 3 | 0.001 | yes |" in text
    assert "| unclear | 0.400 ± 0.000 | 0.410 ± 0.053 | +0.010 ± 0.053 | 3 | 0.775 | no |" in text
    assert "Not clear here: unclear;" in text
    assert seed_blocks(seeds[:1]) == []  # one seed: no spread to show


def test_a_checks_query_bootstrap_reads_the_per_query_files(tmp_path) -> None:
    # The evaluation's per-query APs and the simulator's per-query curve areas give each check the
    # standard error a different draw of test queries would put on its margin: for a difference
    # of two means over the same queries, about sd(per-query difference) / √queries.
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    queries = 400
    bct, old = rng.uniform(0.4, 0.9, queries), rng.uniform(0.4, 0.8, queries)
    pd.DataFrame(
        {
            "query_set": ["gen1-bct"] * queries + ["gen0"] * queries,
            "gallery_set": ["gen0"] * (2 * queries),
            "query": np.tile(np.arange(queries), 2),
            "ap": np.concatenate([bct, old]),
        }
    ).to_parquet(tmp_path / "per_query_ap.parquet")
    full, naive = rng.uniform(0.5, 0.7, queries), rng.uniform(0.4, 0.6, queries)
    pd.DataFrame(
        {
            "strategy": ["rm_full-independent"] * queries + ["independent"] * queries,
            "policy": "old-confidence",
            "mode": ["rank-merge-full"] * queries + ["rank-merge"] * queries,
            "metric": "mAP",
            "kind": "auc_trapezoid",
            "query": np.tile(np.arange(queries), 2),
            "value": np.concatenate([full, naive]),
        }
    ).to_parquet(tmp_path / "backfill_per_query.parquet")
    sc = scenario()
    sc.metrics_dir = tmp_path
    claims = judged(study(sc))
    expected = np.std(bct - old, ddof=1) / np.sqrt(queries)
    compatible = claims[BCT_BACKWARD_COMPATIBLE].checks[0]
    assert compatible.query_se == pytest.approx(expected, rel=0.1)
    assert compatible.as_dict()["query_bootstrap_se"] == pytest.approx(expected, rel=0.1)
    full_method = claims[FULL_METHOD_BEATS_NAIVE].checks[0]
    assert full_method.query_se == pytest.approx(
        np.std(full - naive, ddof=1) / np.sqrt(queries), rel=0.1
    )
    # Without the files there is no bootstrap: NaN, shown as not measured, never a zero.
    assert math.isnan(judged(study(scenario()))[BCT_BACKWARD_COMPATIBLE].checks[0].query_se)
