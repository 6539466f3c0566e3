"""The claims on online backfilling: Seo et al.'s full method against the naive rank merge, the
naive merge's monotonicity, FastFill's σ² order against a random one, and FastFill against FCT (its
whole method, and its training loss alone)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from modelupgrade.backfill.summary import CurveSummary
from modelupgrade.layout import new_model_name
from modelupgrade.report.claims.building import (
    claim_entry,
)
from modelupgrade.report.claims.checks import (
    Check,
    CurveRef,
    Scope,
)
from modelupgrade.report.claims.helpers import (
    larger_auc,
    paired_strategy,
)
from modelupgrade.report.claims.vocabulary import (
    CURVE_METRICS,
    DIP_Z,
    EXTENDED_CLASS,
    FASTFILL_HEAD_KIND,
    FCT_HEAD_KIND,
    FULL_RANK_MERGE,
    INDEPENDENT_KIND,
    MIXED,
    OLD_CONFIDENCE_ORDER,
    OPEN_CLASS,
    RANDOM_ORDER,
    RANK_MERGE,
    ROUNDING,
    UNCERTAINTY_ORDER,
)
from modelupgrade.report.results import ScenarioResults, StudyResults


@claim_entry(
    statement=(
        "Seo et al.'s full method (ρ and the reverse query transform ψ, trained with MCL) "
        "backfills better than the naive two-model rank merge: a larger AUC."
    ),
    source="Seo et al. (Table 1; ordering App. B.2)",
    scope=Scope(
        scenarios=(EXTENDED_CLASS,),
        metric="AUC of mAP and of top-1 over the backfill curve (∫ by the trapezoid rule)",
        protocol=(
            "rank merge of the full method's systems (ψ(ρ(φ_new(q))) searches the old part, so a "
            "query needs no old-model pass: what RQT is for, §4.1) vs of the same old and new "
            "models (RM_naive); lowest old-classifier confidence backfilled first (old-confidence)"
        ),
        elsewhere=(
            "Seo et al. compare the full method with the naive merge on extended-class upgrades "
            "only (Tables 1 and A2; open-class, Fig. 9, against RACT)"
        ),
    ),
    paper=(
        "AUC mAP 53.4 vs 40.0 (ImageNet), 41.4 vs 30.8 (CIFAR-100); "
        "AUC top-1 68.1 vs 63.9 (ImageNet)"
    ),
    missing="no full rank-merge system (rm_full head) was simulated",
)
def full_method_beats_naive_rank_merge(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    for curve in sc.backfill_curves():
        if (curve.policy, curve.mode) != (OLD_CONFIDENCE_ORDER, FULL_RANK_MERGE):
            continue
        naive = sc.curve(paired_strategy(sc, curve.strategy), OLD_CONFIDENCE_ORDER, RANK_MERGE)
        if naive is not None:
            yield from larger_auc(sc, curve, naive, "auc_trapezoid", "AUC", "naive rank merge")


@claim_entry(
    statement=(
        "Distance rank merge of the independently trained old and new models (RM_naive) rises "
        "monotonically as the gallery is backfilled: no dip beyond what the test queries' "
        "sampling explains."
    ),
    source="Seo et al. (§3.1 Eq. 8, §3.2; Figs. 2 and 9)",
    scope=Scope(
        scenarios=(EXTENDED_CLASS, OPEN_CLASS),
        metric=(
            "mAP and top-1 at each point of the curve; a dip counts only beyond 1.96 standard "
            "errors of the test queries' changes there (what another draw of queries would move "
            "it by)"
        ),
        protocol=(
            "rank merge (RM_naive) of the independent new model; old-confidence order (Seo et "
            "al.'s protocol) and random order (App. A)"
        ),
        elsewhere=(
            "Seo et al. test class-split upgrades only (extended-class, Figs. 2 and 6; "
            "open-class, Fig. 9)"
        ),
    ),
    paper=None,
    missing="no rank-merge curve of the independent model was simulated",
)
def rank_merge_is_monotone(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    if sc.backfill is None:
        return
    # Without per-query noise (a summary written before it was kept): one query's worth, the most
    # one query more or less answered right moves mAP or top-1.
    one_query = 1.0 / max(sc.backfill.queries, 1)
    independent = study.strategies_of_kind(INDEPENDENT_KIND)
    for curve in sc.backfill_curves():
        if (
            curve.mode != RANK_MERGE
            or curve.strategy not in independent
            or curve.policy not in (OLD_CONFIDENCE_ORDER, RANDOM_ORDER)
            or not curve.deployable
        ):
            continue
        for metric in CURVE_METRICS:
            if metric not in curve.conditions:
                continue
            # A NaN point of the curve makes the largest drop NaN: not measured.
            conditions = curve.conditions[metric]
            drop, se = conditions.largest_drop, conditions.largest_drop_se
            # A dip counts only beyond what drawing other test queries would move it by.
            noisy = math.isfinite(se)
            tolerance = DIP_Z * se if noisy else one_query
            name = f"{sc.name} {curve.strategy}/{curve.policy} {metric}"
            why = f"{DIP_Z} × its query standard error" if noisy else "one query's worth"
            yield Check(
                key=f"{name} largest dip",
                margin=tolerance + ROUNDING - drop,
                ours=f"{name} dip {drop:.4f}",
                evidence=f"{name}: largest dip {drop:.4f} (tolerance {tolerance:.4f}, {why})",
                compared=(drop,),
                systems=(sc.evaluation.old_model, new_model_name(curve.strategy)),
                query_se=se,
                curves=(CurveRef(sc.name, curve.strategy, curve.policy, curve.mode, metric),),
            )


@claim_entry(
    statement=(
        "FastFill's σ² order (highest uncertainty first) backfills better than a random order "
        "for the same adapter: a larger backfilling-averaged metric."
    ),
    source="FastFill (Table 5, ImageNet ablation)",
    scope=Scope(
        scenarios=(EXTENDED_CLASS,),
        metric="M̃ of mAP and of top-1: the mean over the curve's points (FastFill Eq. 6)",
        protocol=(
            "one search space: new-model queries against the mixed gallery (ψ(old), new); the "
            "random order's curve is the mean of backfill.random_permutations orders (FastFill "
            "averages 5)"
        ),
        elsewhere=(
            "FastFill compares the two orders on class-split upgrades only (ImageNet-500→1000)"
        ),
    ),
    paper="mAP~ 44.84 vs 42.05, top1~ 66.49 vs 64.51 (ImageNet)",
    missing="no FastFill adapter was simulated",
)
def uncertainty_order_beats_random(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    for curve in sc.backfill_curves():
        if (curve.policy, curve.mode) != (UNCERTAINTY_ORDER, MIXED):
            continue
        random_order = sc.curve(curve.strategy, RANDOM_ORDER, MIXED)
        if random_order is not None:
            yield from larger_auc(
                sc,
                curve,
                random_order,
                "auc_mean",
                "mean",
                f"random{_orders(random_order)}",
                ours_name="σ² order ",
            )


NO_FCT_BESIDE_FASTFILL = (
    "no FastFill adapter was simulated beside an FCT adapter on the same new model"
)
# FastFill's own comparisons with FCT: ψ of each on the same new model, one search space.
FASTFILL_SCOPE = Scope(
    scenarios=(EXTENDED_CLASS,),
    metric="M̃ of mAP and of top-1: the mean over the curve's points (FastFill Eq. 6)",
    protocol=(
        "new-model queries against the mixed gallery (ψ(old), new), FastFill's and FCT's ψ on the "
        "same new model; a random order's curve is the mean of backfill.random_permutations orders "
        "(FastFill averages 5)"
    ),
    elsewhere=(
        "FastFill reports both on class-extension upgrades only (ImageNet 500→1000 classes; "
        "Tables 2–3 also Places-365 182→365 and VGGFace2 863→8631 identities)"
    ),
)


def fastfill_against_fct(sc: ScenarioResults, fastfill_order: str) -> Iterator[Check]:
    """FastFill's curve in ``fastfill_order`` against FCT's in a random order (FCT has no order of
    its own: FastFill backfills it at random), one check per curve metric."""
    for curve in sc.backfill_curves():
        if (curve.policy, curve.mode) != (fastfill_order, MIXED):
            continue
        if sc.head_kinds.get(curve.strategy) != FASTFILL_HEAD_KIND:
            continue
        # FCT's head on the same new model, if one was trained.
        fct = sc.heads_of_kind(FCT_HEAD_KIND).get(sc.head_systems.get(curve.strategy, ""))
        fct_random = None if fct is None else sc.curve(fct, RANDOM_ORDER, MIXED)
        if fct_random is not None:
            yield from larger_auc(
                sc,
                curve,
                fct_random,
                "auc_mean",
                "mean",
                f"FCT random{_orders(fct_random)}",
                ours_name="σ² order " if fastfill_order == UNCERTAINTY_ORDER else "random ",
            )


def _orders(curve: CurveSummary) -> str:
    return f" (the mean of {curve.permutations} orders)" if curve.permutations > 1 else ""


@claim_entry(
    statement=(
        "FastFill backfills better than FCT: its adapter in its σ² order has a larger "
        "backfilling-averaged metric than FCT's adapter in a random order."
    ),
    source="FastFill (Tables 1–3)",
    scope=FASTFILL_SCOPE,
    paper=(
        "mAP~ 44.84 vs 40.47, top1~ 66.49 vs 62.80 (ImageNet); mAP~ 71.57 vs 70.26 (VGGFace2); "
        "mAP~ 19.48 vs 16.81 (Places-365)"
    ),
    missing=NO_FCT_BESIDE_FASTFILL,
)
def fastfill_beats_fct(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    yield from fastfill_against_fct(sc, UNCERTAINTY_ORDER)


@claim_entry(
    statement=(
        "FastFill's training loss alone (Eq. 5) backfills better than FCT's (squared error): "
        "in the same random order, a larger backfilling-averaged metric."
    ),
    source="FastFill (Table 5, ImageNet ablation; §4.2)",
    scope=FASTFILL_SCOPE,
    paper="mAP~ 42.05 vs 40.47, top1~ 64.51 vs 62.80 (ImageNet)",
    missing=NO_FCT_BESIDE_FASTFILL,
)
def fastfill_loss_beats_fct(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    yield from fastfill_against_fct(sc, RANDOM_ORDER)
