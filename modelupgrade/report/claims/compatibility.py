"""The claims on compatible training and forward adapters: BCT's criterion and its cost, DMU against
BCT, ψ on the stored old vectors."""

from __future__ import annotations

import math
from collections.abc import Iterator

from modelupgrade.evaluation.summary import (
    BACKWARD,
    FORWARD_HEAD,
    SELF,
)
from modelupgrade.layout import new_model_name
from modelupgrade.report.claims.building import (
    claim_entry,
)
from modelupgrade.report.claims.checks import (
    Check,
    Scope,
)
from modelupgrade.report.claims.helpers import (
    Measured,
    best_up,
    difference_se,
    label,
    old_pair,
    versus,
)
from modelupgrade.report.claims.vocabulary import (
    BCT_KIND,
    DMU_KIND,
    EXTENDED_CLASS,
    EXTENDED_DATA,
    IDENTICAL_DATA,
    OPEN_DATA,
)
from modelupgrade.report.results import ScenarioResults, StudyResults
from modelupgrade.report.statistics import (
    joint_bootstrap_se,
)


@claim_entry(
    statement="BCT's new model is backward compatible: M(φ_new^BCT, φ_old) > M(φ_old, φ_old).",
    source="BCT criterion (Shen et al.); DMU (Table 1), UniBCT (Table 4)",
    scope=Scope(
        scenarios=(EXTENDED_DATA, OPEN_DATA, EXTENDED_CLASS),
        metric="the scenario's headline metric (GLDv2 mAP@100, IJB-C TAR in the papers)",
        protocol="backfill-free: new-model queries against the old gallery",
        elsewhere=(
            "open-class: UniBCT (Table 4) finds BCT inapplicable to open-set splits (the old "
            "classifier has no row for the new classes); identical-data: BiCT (Table 5) reports "
            "BCT for softmax → ArcFace (GLDv2 22.86 vs 18.26), but this study trains only the "
            "independent model there (params/full-cpu.yaml)"
        ),
    ),
    paper=(
        "GLDv2 mAP@100, M(BCT, old) vs M(old, old): 21.12 vs 18.93 (30%→100% data), "
        "20.74 vs 18.93 (30%→70% data), 24.39 vs 17.53 (30% class→100%)"
    ),
    missing="BCT was not evaluated",
)
def bct_is_backward_compatible(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    old_self = sc.evaluation.old_self
    for bct in study.strategies_of_kind(BCT_KIND):
        cross = sc.value(bct, BACKWARD)
        if cross is not None and old_self is not None:
            bct_up = Measured(
                f"M({label(bct)}, old)", cross, (new_model_name(bct), sc.evaluation.old_model)
            )
            old_old = Measured("M(old, old)", old_self, old_pair(sc))
            yield versus(sc, bct_up, old_old, (sc.evaluation.old_model, new_model_name(bct)))


@claim_entry(
    statement=(
        "BCT costs new-to-new accuracy: M(φ_new^BCT, φ_new^BCT) is below the independently "
        "trained new model's (Δ↓ > 0)."
    ),
    source="DMU (§1, Table 1)",
    scope=Scope(
        scenarios=(EXTENDED_DATA, OPEN_DATA, EXTENDED_CLASS),
        metric=(
            "the scenario's headline metric. The paper measures the loss on the landmark "
            "benchmarks (GLDv2 mAP@100 4.03/0.80/1.88 %; ROxford 2.82/−0.98/2.49 %); its own "
            "IJB-C rows give BCT Δ↓ −0.07 % and 0.11 % (Table 2): a GLDv2 finding, not a law"
        ),
        protocol="self-test of each new model; the reference is the independently trained one",
        elsewhere=(
            "open-class, identical-data: DMU reports no BCT there (its r50→r101 row also "
            "changes the data)"
        ),
    ),
    paper="GLDv2 Δ↓ of BCT: 4.03% (30%→100% data), 0.80% (30%→70% data), 1.88% (class)",
    missing="BCT or the independent model was not evaluated",
)
def bct_loses_new_to_new_accuracy(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    oracle_self = sc.evaluation.oracle_self
    for bct in study.strategies_of_kind(BCT_KIND):
        bct_self = sc.value(bct, SELF)
        if bct_self is not None and oracle_self is not None:
            name = label(bct)
            yield Check(
                key=f"{sc.name}: M({name}, {name}) vs independent",
                margin=oracle_self - bct_self,
                ours=f"{sc.name}: {bct_self:.4f} vs {oracle_self:.4f}",
                evidence=(
                    f"{sc.name}: M({name}, {name}) = {bct_self:.4f} vs independent "
                    f"{oracle_self:.4f}"
                ),
                compared=(bct_self, oracle_self),
                # BCT's model is trained against the old one: it rests on the old model too.
                systems=(sc.evaluation.old_model, new_model_name(bct), sc.evaluation.oracle or ""),
                query_se=difference_se(
                    sc,
                    (sc.evaluation.oracle or "", sc.evaluation.oracle or ""),
                    (new_model_name(bct), new_model_name(bct)),
                ),
            )


@claim_entry(
    statement=(
        "DMU upgrades better than BCT on both sides: a larger new-to-old gain Δ↑ and a smaller "
        "new-to-new loss Δ↓."
    ),
    source="DMU (Table 1)",
    scope=Scope(
        scenarios=(EXTENDED_DATA, OPEN_DATA, EXTENDED_CLASS),
        metric="Δ↑ and Δ↓ (DMU Eqs. 6–7, relative %, of the headline metric)",
        protocol=(
            "DMU's Δ↑ from its best new-to-old search, backward or through its own ψ (DMU's "
            "tables fold ψ into new-to-old); BCT's from its backward search"
        ),
        elsewhere=(
            "open-class, identical-data: not in DMU's tables (its r50→r101 row also changes "
            "the data)"
        ),
    ),
    paper=(
        "GLDv2, DMU vs BCT: Δ↑ 19.18 vs 11.57%, Δ↓ 2.27 vs 4.03% (30%→100% data); "
        "Δ↑ 14.63 vs 9.56%, Δ↓ −0.42 vs 0.80% (30%→70% data)"
    ),
    missing="BCT or DMU was not evaluated",
)
def dmu_beats_bct_on_both_sides(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    for bct_name in study.strategies_of_kind(BCT_KIND):
        for dmu_name in study.strategies_of_kind(DMU_KIND):
            bct, dmu = label(bct_name), label(dmu_name)
            bct_up = sc.row(bct_name, BACKWARD)
            dmu_ups = [r for r in sc.rows(dmu_name) if r.comparison in (BACKWARD, FORWARD_HEAD)]
            if bct_up is not None and dmu_ups:
                best = best_up(dmu_ups)
                ours, theirs = best.delta_up_pct, bct_up.delta_up_pct
                through = " through ψ" if best.comparison == FORWARD_HEAD else ""
                yield Check(
                    key=f"{sc.name}: Δ↑ % {dmu} vs {bct}",
                    margin=ours - theirs,
                    ours=f"{sc.name}: Δ↑ {ours:.2f} vs {theirs:.2f}%",
                    evidence=f"{sc.name}: Δ↑ {dmu}{through} {ours:.2f}% vs {bct} {theirs:.2f}%",
                    compared=(ours, theirs),
                    systems=(
                        sc.evaluation.old_model,
                        new_model_name(bct_name),
                        new_model_name(dmu_name),
                        best.gallery_set,
                    ),
                    # Δ↑ DMU − Δ↑ BCT = 100 (M(DMU, ·) − M(BCT, old)) / M(old, old).
                    query_se=joint_bootstrap_se(
                        [
                            sc.per_query_ap(best.query_set, best.gallery_set),
                            sc.per_query_ap(bct_up.query_set, bct_up.gallery_set),
                            sc.per_query_ap(*old_pair(sc)),
                        ],
                        lambda dmu, bct, old: 100 * (dmu - bct) / old,
                    ),
                    digits=2,
                )
            bct_self, dmu_self = sc.row(bct_name, SELF), sc.row(dmu_name, SELF)
            if bct_self is not None and dmu_self is not None:
                ours, theirs = dmu_self.delta_down_pct, bct_self.delta_down_pct
                yield Check(
                    key=f"{sc.name}: Δ↓ % {dmu} vs {bct}",
                    margin=theirs - ours,
                    ours=f"{sc.name}: Δ↓ {ours:.2f} vs {theirs:.2f}%",
                    evidence=f"{sc.name}: Δ↓ {dmu} {ours:.2f}% vs {bct} {theirs:.2f}%",
                    compared=(ours, theirs),
                    systems=(
                        sc.evaluation.old_model,
                        new_model_name(bct_name),
                        new_model_name(dmu_name),
                        sc.evaluation.oracle or "",
                    ),
                    # Δ↓ BCT − Δ↓ DMU = 100 (M(DMU, DMU) − M(BCT, BCT)) / M(oracle, oracle).
                    query_se=joint_bootstrap_se(
                        [
                            sc.per_query_ap(new_model_name(dmu_name), new_model_name(dmu_name)),
                            sc.per_query_ap(new_model_name(bct_name), new_model_name(bct_name)),
                            sc.per_query_ap(sc.evaluation.oracle or "", sc.evaluation.oracle or ""),
                        ],
                        lambda dmu, bct, oracle: 100 * (dmu - bct) / oracle,
                    ),
                    digits=2,
                )


@claim_entry(
    statement=(
        "A forward adapter ψ on the stored old vectors beats serving without it: "
        "M(new, ψ(old)) > max(M(new, old), M(old, old)), for a compatible new model (BiCT, "
        "DMU) and an independent one (FCT)."
    ),
    source="BiCT (Tables 4–5), DMU (Eq. 12), FCT (Ramanujan et al.)",
    scope=Scope(
        scenarios=(EXTENDED_DATA, EXTENDED_CLASS, IDENTICAL_DATA),
        metric="the scenario's headline metric (GLDv2 mAP@100, ImageNet mAP in the papers)",
        protocol=(
            "new-model queries against the whole old gallery transformed by ψ, against the best "
            "system that needs no ψ; a compatible model's check is tested on the seeds where it "
            "passes BCT's criterion M(new, old) > M(old, old) (the premise of its paper's row)"
        ),
        elsewhere=(
            "open-data, open-class: no paper compares M(new, ψ(old)) with M(new, old) or "
            "M(old, old) there"
        ),
    ),
    paper=(
        "BiCT, GLDv2: 26.09 vs 23.61 (25%→100% data), 27.04 vs 25.21 (r18→r50), 26.69 vs "
        "22.86 (softmax→ArcFace); "
        "FCT, ImageNet: 44.0 vs M(old, old) 28.3 (with side-information)"
    ),
    missing="no forward head was evaluated",
)
def forward_adapters_raise_new_to_old(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    old_self = sc.evaluation.old_self
    for strategy in sc.evaluation.strategies:
        backward = sc.value(strategy, BACKWARD)
        if backward is None or old_self is None:
            continue
        independent = sc.evaluation.oracle == new_model_name(strategy)
        # NaN (not measured) on either side leaves the reference not measured.
        reference = math.nan if math.isnan(backward + old_self) else max(backward, old_self)
        reference_name = "M(old, old)" if reference == old_self else f"M({strategy}, old)"
        # FCT's ψ pairs with a model trained without the old one; BiCT's and DMU's assume a
        # compatible one.
        premise = (
            ""
            if independent or backward > old_self
            else f"premise: M({strategy}, old) {backward:.4f} ≤ M(old, old) {old_self:.4f} "
            "(not backward compatible)"
        )
        for row in sc.rows(strategy):
            if row.comparison != FORWARD_HEAD:
                continue
            yield Check(
                key=f"{sc.name}: M({row.query_set}, {row.gallery_set}) vs max(M(new, old), "
                "M(old, old))",
                margin=row.value - reference,
                ours=f"{sc.name} {row.head_set}: {row.value:.4f} vs {reference:.4f}",
                evidence=(
                    f"{sc.name}: M({row.query_set}, {row.gallery_set}) = "
                    f"{row.value:.4f} vs {reference_name} = {reference:.4f}"
                ),
                compared=(row.value, reference),
                systems=(sc.evaluation.old_model, row.query_set, row.gallery_set),
                excluded=premise,
                query_se=difference_se(
                    sc,
                    (row.query_set, row.gallery_set),
                    old_pair(sc)
                    if reference == old_self
                    else (new_model_name(strategy), sc.evaluation.old_model),
                ),
            )
