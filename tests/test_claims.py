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
from modelupgrade.evaluation.summary import ComparisonRow, ScenarioEvaluation
from modelupgrade.report import Claim, check_claims
from modelupgrade.report.claims import CLAIMS
from modelupgrade.report.results import ScenarioResults, StudyResults

NAN = float("nan")
CLAIM_COUNT = 9
# The claims in ``CLAIMS`` order, by what they are about.
(
    BCT_BACKWARD_COMPATIBLE,
    BCT_LOSES_NEW_TO_NEW,
    DMU_BEATS_BCT,
    FORWARD_ADAPTERS_RAISE,
    FULL_METHOD_BEATS_NAIVE,
    RANK_MERGE_MONOTONE,
    UNCERTAINTY_BEATS_RANDOM,
    DRIFT_ADAPTER_RECOVERS,
    SLERP_BACKWARD_COMPATIBLE,
) = range(CLAIM_COUNT)
# The backfill study's queries: one query's worth of mAP or top-1 is 1/QUERIES.
QUERIES = 100
TOLERANCE = 1 / QUERIES

# Every number the claims read; None leaves its row or curve out. On these, each claim holds.
HOLDING: dict[str, Any] = {
    "old_self": 0.40,  # M(old, old)
    "oracle_self": 0.70,  # M(independent, independent)
    "bct_backward": 0.45,  # M(BCT, old) > M(old, old)
    "bct_self": 0.66,  # M(BCT, BCT) < the independent model's
    "bct_delta_up": 12.5,  # Δ↑ of BCT (backward) < Δ↑ of DMU (its best: through ψ)
    "dmu_delta_up": 25.0,
    "dmu_forward_delta_up": 37.5,
    "bct_delta_down": 5.71,  # Δ↓ of BCT > Δ↓ of DMU
    "dmu_delta_down": 1.43,
    "dmu_backward": 0.50,
    "independent_forward": 0.45,  # M(independent, ψ(old)) > M(old, old): FCT's reference
    "dmu_forward": 0.55,  # M(DMU, ψ(old)) > M(DMU, old)
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
    # Query-side training-free adapters of the independent model, M(adapter(new), old), fitted on
    # 3000 pairs: the best Drift-Adapter kind recovers ≥ 95 % of M(independent, independent) =
    # 0.70; SLERP beats M(old, old) and Procrustes alone. The residual MLP on 300 pairs is not
    # the largest sample: the claims do not read it.
    "procrustes_query": 0.67,
    "affine_query": 0.60,
    "residual_query": 0.68,
    "residual_query_small": 0.69,
    "slerp_query": 0.685,
}

# For each claim, numbers that contradict it, all else as in HOLDING.
CONTRADICTING: dict[int, dict[str, Any]] = {
    BCT_BACKWARD_COMPATIBLE: {"bct_backward": 0.39},
    BCT_LOSES_NEW_TO_NEW: {"bct_self": 0.72},
    DMU_BEATS_BCT: {"dmu_delta_down": 6.0},
    FORWARD_ADAPTERS_RAISE: {"dmu_forward": 0.48},
    FULL_METHOD_BEATS_NAIVE: {"full_auc": 0.44},
    RANK_MERGE_MONOTONE: {"rank_merge_points": (0.40, 0.50, 0.45, 0.70)},
    UNCERTAINTY_BEATS_RANDOM: {"uncertainty_auc": 0.50},
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
    DRIFT_ADAPTER_RECOVERS: {"procrustes_query": NAN, "affine_query": NAN, "residual_query": NAN},
    SLERP_BACKWARD_COMPATIBLE: {"slerp_query": NAN},
}

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
ALSO_LEFT_OUT = {RANK_MERGE_MONOTONE: {FULL_METHOD_BEATS_NAIVE}}
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
    )


def study(*scenarios: ScenarioResults) -> StudyResults:
    return StudyResults(
        list(scenarios),
        strategy_kinds={"independent": "independent", "bct": "bct", "dmu": "dmu"},
    )


def verdicts(results: StudyResults) -> list[str]:
    return [claim.verdict for claim in check_claims(results)]


def all_hold_but(claims: int | set[int], verdict: str) -> list[str]:
    others = {claims} if isinstance(claims, int) else claims
    return [verdict if i in others else "holds" for i in range(CLAIM_COUNT)]


# -- the registry ----------------------------------------------------------------------------------


def test_each_claim_names_its_source_scope_and_the_papers_numbers() -> None:
    claims = check_claims(study(scenario()))
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
        assert claim.seeds == 1
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
    claim = check_claims(study(scenario()))[BCT_BACKWARD_COMPATIBLE]
    record = claim.as_dict()
    assert list(record) == CLAIM_RECORD_KEYS
    assert record["scope"]["scenarios"] == ["extended-data", "open-data", "extended-class"]
    assert (record["ours"], record["seeds"], record["verdict"]) == (
        "sc: 0.4500 vs 0.4000",
        1,
        "holds",
    )
    (check,) = record["checks"]
    assert check == {
        "check": "sc: M(BCT, old) vs M(old, old)",
        "seeds": 1,
        "mean": [0.45, 0.40],
        "sd": [None, None],  # no spread from one seed
        "difference_mean": pytest.approx(0.05),
        "difference_sd": None,
        "verdict": "holds",
    }
    json.dumps(record, allow_nan=False)  # claims.json is strict JSON


# -- seeds -----------------------------------------------------------------------------------------


def seeds_of(*backward: float, **numbers: Any) -> list[StudyResults]:
    """One study per seed: M(BCT, old) as given on each, M(old, old) 0.40 on all."""
    return [study(scenario(bct_backward=value, **numbers)) for value in backward]


def bct_claim(seeds: list[StudyResults]) -> Claim:
    return check_claims(seeds[0], seeds[1:])[BCT_BACKWARD_COMPATIBLE]


def test_a_difference_beyond_the_seeds_spread_decides_the_verdict() -> None:
    # Differences 0.05, 0.06, 0.04 over M(old, old): mean 0.05, sd 0.01.
    holds = bct_claim(seeds_of(0.45, 0.46, 0.44))
    assert (holds.verdict, holds.seeds) == ("holds", 3)
    # The study's own seed's text, its numbers now mean ± sd over the seeds.
    assert holds.ours == "sc: 0.4500 ± 0.0100 vs 0.4000 ± 0.0000"
    (check,) = holds.as_dict()["checks"]
    assert check["mean"] == pytest.approx([0.45, 0.40])
    assert check["sd"] == pytest.approx([0.01, 0.0])
    assert (check["difference_mean"], check["difference_sd"]) == (
        pytest.approx(0.05),
        pytest.approx(0.01),
    )
    assert holds.evidence.startswith(
        "sc: M(BCT, old) vs M(old, old): 0.4500 ± 0.0100 vs 0.4000 ± 0.0000 over 3 of 3 seeds, "
        "difference 0.0500 ± 0.0100: holds. The study's own seed: sc: M(BCT, old) = 0.4500"
    )
    assert bct_claim(seeds_of(0.35, 0.36, 0.34)).verdict == "fails"


def test_a_difference_within_the_seeds_spread_is_inconclusive() -> None:
    # The study's own seed alone would hold (0.45 > 0.40); the seeds disagree: mean 0.4067,
    # sd 0.0404 > 0.0067.
    within = bct_claim(seeds_of(0.45, 0.37, 0.40 + 1e-9))
    assert within.verdict == "inconclusive"
    assert within.holds is None
    assert check_claims(study(scenario(bct_backward=0.45)))[BCT_BACKWARD_COMPATIBLE].holds


def test_a_check_measured_on_one_seed_of_several_is_inconclusive() -> None:
    seeds = seeds_of(0.45, NAN, NAN)
    claim = bct_claim(seeds)
    assert claim.verdict == "inconclusive"
    assert claim.seeds == 1
    assert "over 1 of 3 seeds" in claim.evidence
    # Two seeds measured it: it stands on those two.
    assert bct_claim(seeds_of(0.45, NAN, 0.46)).verdict == "holds"


def test_one_failing_check_fails_a_claim_an_inconclusive_one_leaves_it_open() -> None:
    def two_scenarios(first: float, second: float) -> StudyResults:
        return study(scenario("a", bct_backward=first), scenario("b", bct_backward=second))

    clear, unsure, contradicted = (0.45, 0.46, 0.44), (0.45, 0.37, 0.40), (0.35, 0.36, 0.34)
    open_claim = [two_scenarios(c, u) for c, u in zip(clear, unsure, strict=True)]
    assert bct_claim(open_claim).verdict == "inconclusive"
    failed = [two_scenarios(u, x) for u, x in zip(unsure, contradicted, strict=True)]
    assert bct_claim(failed).verdict == "fails"
    both = [two_scenarios(c, c) for c in clear]
    claim = bct_claim(both)
    assert claim.verdict == "holds"
    assert [c["check"] for c in claim.as_dict()["checks"]] == [
        "a: M(BCT, old) vs M(old, old)",
        "b: M(BCT, old) vs M(old, old)",
    ]


# -- the verdicts ----------------------------------------------------------------------------------


def test_every_claim_holds_on_the_numbers_made_to_hold() -> None:
    claims = check_claims(study(scenario()))
    assert [c.verdict for c in claims] == ["holds"] * CLAIM_COUNT
    assert all(c.holds is True for c in claims)
    assert [c.evidence for c in claims] == [
        "sc: M(BCT, old) = 0.4500 vs M(old, old) = 0.4000",
        "sc: M(BCT, BCT) = 0.6600 vs independent 0.7000",
        "sc: Δ↑ DMU through ψ 37.50% vs BCT 12.50%; sc: Δ↓ DMU 1.43% vs BCT 5.71%",
        (
            "sc: M(gen1-independent, fct-independent(gen0)) = 0.4500 vs M(old, old) = 0.4000; "
            "sc: M(gen1-dmu, dmu-dmu(gen0)) = 0.5500 vs M(dmu, old) = 0.5000"
        ),
        (
            "sc rm_full-independent: AUC mAP 0.5800 vs naive rank merge 0.4800; "
            "sc rm_full-independent: AUC top1 0.6600 vs naive rank merge 0.6000"
        ),
        (
            "sc independent/old-confidence mAP: largest dip 0.0000 (tolerance 0.0100); "
            "sc independent/old-confidence top1: largest dip 0.0000 (tolerance 0.0100)"
        ),
        (
            "sc fastfill-independent: mean mAP σ² order 0.6000 vs random 0.5200; "
            "sc fastfill-independent: mean top1 σ² order 0.7500 vs random 0.7000"
        ),
        (
            "sc: best query-side adapter residual_mlp_query.all-independent M = 0.6800 vs "
            "M(independent, independent) = 0.7000: 97.1 % on 3000 pairs (each kind: "
            "procrustes_query 95.7 %, affine_query 85.7 %, residual_mlp_query 97.1 %)"
        ),
        (
            "sc: M(slerp_query.all-independent, old) = 0.6850 vs M(old, old) = 0.4000; "
            "sc: M(slerp_query.all-independent, old) = 0.6850 vs "
            "M(procrustes_query.all-independent, old) = 0.6700 (3000 pairs)"
        ),
    ]
    assert [c.ours for c in claims] == [
        "sc: 0.4500 vs 0.4000",
        "sc: 0.6600 vs 0.7000",
        "sc: Δ↑ 37.50 vs 12.50%; sc: Δ↓ 1.43 vs 5.71%",
        "sc fct-independent(gen0): 0.4500 vs 0.4000; sc dmu-dmu(gen0): 0.5500 vs 0.5000",
        "sc: mAP 0.5800 vs 0.4800; sc: top1 0.6600 vs 0.6000",
        (
            "sc independent/old-confidence mAP dip 0.0000; "
            "sc independent/old-confidence top1 dip 0.0000"
        ),
        "sc: mAP 0.6000 vs 0.5200; sc: top1 0.7500 vs 0.7000",
        "sc: 97.1 % (residual_mlp_query, 3000 pairs)",
        "sc: 0.6850 vs old 0.4000; sc: 0.6850 vs Procrustes 0.6700",
    ]


@pytest.mark.parametrize("claim", sorted(CONTRADICTING))
def test_a_claim_its_numbers_contradict_fails(claim: int) -> None:
    claims = check_claims(study(scenario(**CONTRADICTING[claim])))
    assert [c.verdict for c in claims] == all_hold_but(claim, "fails")
    assert claims[claim].holds is False


def test_the_contradicting_numbers_are_the_evidence() -> None:
    # Ties do not hold: each comparison of two numbers is a strict inequality.
    tie = check_claims(study(scenario(bct_backward=0.40)))[BCT_BACKWARD_COMPATIBLE]
    assert (tie.holds, tie.evidence) == (False, "sc: M(BCT, old) = 0.4000 vs M(old, old) = 0.4000")
    drop = check_claims(study(scenario(**CONTRADICTING[RANK_MERGE_MONOTONE])))
    assert drop[RANK_MERGE_MONOTONE].evidence.startswith(
        "sc independent/old-confidence mAP: largest dip 0.0500 (tolerance 0.0100)"
    )


# -- DMU: Δ↑ as well as Δ↓ -------------------------------------------------------------------------


def test_dmu_fails_on_a_smaller_gain_even_with_the_smaller_loss() -> None:
    claims = check_claims(study(scenario(dmu_delta_up=10.0, dmu_forward_delta_up=11.0)))
    assert [c.verdict for c in claims] == all_hold_but(DMU_BEATS_BCT, "fails")
    assert claims[DMU_BEATS_BCT].evidence == (
        "sc: Δ↑ DMU through ψ 11.00% vs BCT 12.50%; sc: Δ↓ DMU 1.43% vs BCT 5.71%"
    )


def test_dmus_gain_is_its_best_new_to_old_search_and_bcts_its_backward_one() -> None:
    # DMU's tables fold ψ into new-to-old: its backward Δ↑ alone below BCT's does not fail it.
    dmu = check_claims(study(scenario(dmu_delta_up=10.0)))[DMU_BEATS_BCT]
    assert dmu.holds is True and "Δ↑ DMU through ψ 37.50%" in dmu.evidence
    # Without ψ, its backward search is its gain.
    backward = check_claims(study(scenario(dmu_forward_delta_up=NAN)))[DMU_BEATS_BCT]
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
    claims = check_claims(study(scenario(**numbers)))
    assert [c.verdict for c in claims] == all_hold_but(RANK_MERGE_MONOTONE, verdict)


def test_a_top1_dip_fails_the_monotone_claim_and_is_named() -> None:
    claim = check_claims(study(scenario(rank_merge_top1_points=(0.50, 0.62, 0.60, 0.80))))[
        RANK_MERGE_MONOTONE
    ]
    assert claim.evidence.endswith(
        "sc independent/old-confidence top1: largest dip 0.0200 (tolerance 0.0100)"
    )
    assert claim.ours == (
        "sc independent/old-confidence mAP dip 0.0000; "
        "sc independent/old-confidence top1 dip 0.0200"
    )


# -- the scopes ------------------------------------------------------------------------------------


def test_a_claim_is_judged_only_on_the_scenario_kinds_of_its_scope() -> None:
    # BCT contradicted on open-class, which no paper reports BCT on: shown, not counted.
    outside = scenario("oc", kind="open-class", bct_backward=0.39)
    compatible = check_claims(study(scenario(), outside))[BCT_BACKWARD_COMPATIBLE]
    assert compatible.verdict == "holds"
    assert compatible.evidence == (
        "sc: M(BCT, old) = 0.4500 vs M(old, old) = 0.4000. Outside the paper's scope, not "
        "counted: oc: M(BCT, old) = 0.3900 vs M(old, old) = 0.4000"
    )
    assert compatible.ours == "sc: 0.4500 vs 0.4000"
    # A study with scenarios outside the scope only tests nothing, and says so.
    claims = check_claims(study(scenario("ed", kind="extended-data")))
    assert [c.verdict for c in claims] == all_hold_but(
        {FULL_METHOD_BEATS_NAIVE, RANK_MERGE_MONOTONE, UNCERTAINTY_BEATS_RANDOM}, "not tested"
    )
    fastfill = claims[UNCERTAINTY_BEATS_RANDOM]
    assert fastfill.evidence.startswith(
        "nothing measured on the paper's scope (extended-class). Outside the paper's scope, not "
        "counted: ed fastfill-independent: mean mAP σ² order 0.6000 vs random 0.5200"
    )
    assert fastfill.ours == "outside the scope only: ed: mAP 0.6000 vs 0.5200 (+1 more)"


def test_the_naive_rank_merge_is_the_independent_models_in_seo_et_als_orders() -> None:
    # The old-confidence order is checked; so is the random order, and nothing else.
    random_order = scenario()
    assert random_order.backfill is not None
    curves = [
        c.model_copy(update={"policy": "random"}) if c.mode == "rank-merge" else c
        for c in random_order.backfill.curves
    ]
    random_order.backfill = random_order.backfill.model_copy(update={"curves": curves})
    claim = check_claims(study(random_order))[RANK_MERGE_MONOTONE]
    assert claim.verdict == "fails"  # the entropy-order and BCT curves, now in random order, dip
    assert "sc independent/random mAP: largest dip 0.0000" in claim.evidence
    assert "sc bct/random" not in claim.evidence  # BCT's model is not RM_naive's


def test_many_checks_are_summarised_in_ours() -> None:
    failing = scenario("oc", kind="open-class", rank_merge_points=(0.40, 0.50, 0.45, 0.70))
    claim = check_claims(study(scenario(), failing))[RANK_MERGE_MONOTONE]
    assert claim.verdict == "fails"
    assert claim.ours == "3/4 hold; e.g. oc independent/old-confidence mAP dip 0.0500"
    held = check_claims(study(scenario(), scenario("oc", kind="open-class")))
    assert held[RANK_MERGE_MONOTONE].ours == "4/4 hold"


# -- not tested ------------------------------------------------------------------------------------


@pytest.mark.parametrize("claim", sorted(NOT_MEASURED))
def test_a_nan_input_leaves_a_claim_not_tested_never_failed(claim: int) -> None:
    claims = check_claims(study(scenario(**NOT_MEASURED[claim])))
    assert [c.verdict for c in claims] == all_hold_but(claim, "not tested")
    assert claims[claim].holds is None
    assert "not measured" in claims[claim].evidence  # the reader sees which number was missing
    assert claims[claim].ours is None


@pytest.mark.parametrize("claim", sorted(LEFT_OUT))
def test_a_claim_whose_numbers_are_left_out_is_not_tested(claim: int) -> None:
    changes, why = LEFT_OUT[claim]
    claims = check_claims(study(scenario(**changes)))
    untested = {claim} | ALSO_LEFT_OUT.get(claim, set())
    assert [c.verdict for c in claims] == all_hold_but(untested, "not tested")
    assert (claims[claim].holds, claims[claim].evidence, claims[claim].ours) == (None, why, None)


def test_a_nan_check_is_left_out_and_the_claim_stands_on_the_measured_ones() -> None:
    # M(old, old) NaN: FCT's check of the independent model (against old/old) is not measured; the
    # DMU adapter's (against M(DMU, old)) is, and holds, so the forward claim holds on it alone.
    claims = check_claims(study(scenario(old_self=NAN)))
    assert [c.verdict for c in claims] == all_hold_but(BCT_BACKWARD_COMPATIBLE, "not tested")
    forward = claims[FORWARD_ADAPTERS_RAISE]
    lines = forward.evidence.split("; ")
    assert "not measured" in lines[0] and lines[1] == (
        "sc: M(gen1-dmu, dmu-dmu(gen0)) = 0.5500 vs M(dmu, old) = 0.5000"
    )
    assert forward.ours == "sc dmu-dmu(gen0): 0.5500 vs 0.5000; 1 not measured"
    # …and a measured check that fails still fails the claim beside a NaN one.
    failing = study(scenario(old_self=NAN, dmu_forward=0.48))
    assert verdicts(failing)[FORWARD_ADAPTERS_RAISE] == "fails"


def test_across_scenarios_a_nan_one_neither_carries_nor_blocks_the_verdict() -> None:
    measured, unmeasured = scenario("measured"), scenario("unmeasured", bct_backward=NAN)
    compatible = check_claims(study(unmeasured, measured))[BCT_BACKWARD_COMPATIBLE]
    assert compatible.verdict == "holds"
    assert compatible.evidence == (
        "unmeasured: M(BCT, old) = nan vs M(old, old) = 0.4000 (not measured); "
        "measured: M(BCT, old) = 0.4500 vs M(old, old) = 0.4000"
    )
    contradicted = scenario("measured", bct_backward=0.39)
    assert verdicts(study(unmeasured, contradicted))[BCT_BACKWARD_COMPATIBLE] == "fails"
    assert verdicts(study(unmeasured))[BCT_BACKWARD_COMPATIBLE] == "not tested"


def test_a_study_without_scenarios_tests_nothing() -> None:
    assert verdicts(study()) == ["not tested"] * CLAIM_COUNT


def test_inf_is_a_measured_number_not_a_missing_one() -> None:
    # Only NaN means "not measured"; an infinite Δ↓ (a zero reference) still compares.
    claims = check_claims(study(scenario(bct_delta_down=math.inf)))
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
    assert "| clear | 0.4000 ± 0.0000 | 0.7000 ± 0.0200 | 0.3000 ± 0.0200 | 3 | yes |" in text
    assert "| unclear | 0.4000 ± 0.0000 | 0.4100 ± 0.0529 | 0.0100 ± 0.0529 | 3 | no |" in text
    assert "Not clear here: unclear;" in text
    assert seed_blocks(seeds[:1]) == []  # one seed: no spread to show
