"""The claims on training-free adapters: Drift-Adapter's recovery of re-indexing, SLERP's backward
compatibility."""

from __future__ import annotations

import math
from collections.abc import Iterator

from modelupgrade.evaluation.summary import (
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
    old_pair,
    query_adapters,
    versus,
)
from modelupgrade.report.claims.vocabulary import (
    ALL_SCENARIO_KINDS,
    COMPARABLE_PAIR,
    DRIFT_ADAPTER_QUERY_KINDS,
    DRIFT_ADAPTER_RECOVERY,
    PROCRUSTES_QUERY_KIND,
    SLERP_KIND,
)
from modelupgrade.report.results import ScenarioResults, StudyResults
from modelupgrade.report.statistics import (
    joint_bootstrap_se,
)


@claim_entry(
    statement=(
        "A training-free query-side adapter (orthogonal Procrustes, low-rank affine or residual "
        "MLP), fitted on a sample of paired old/new embeddings, recovers 95–99 % of full "
        "re-indexing: M(adapter(φ_new), φ_old) ≥ 0.95 · M(φ_new, φ_new)."
    ),
    source="Drift-Adapter (Vejendla, EMNLP 2025, arXiv 2509.23471; abstract)",
    scope=Scope(
        scenarios=ALL_SCENARIO_KINDS,
        metric="the scenario's headline metric (Recall@10 and MRR in the paper)",
        protocol=(
            "new-model queries mapped into the old space by the best of the three adapters "
            "fitted on the largest sample, against the untouched old gallery; the reference is "
            "the same new model against its fully re-embedded gallery. The paper's: text "
            "embeddings (MTEB corpora) and a CLIP image-model upgrade with 1M items, its own "
            "model pairs and sample sizes"
        ),
        elsewhere=(
            "none: every scenario kind here is an upgrade between two independently trained "
            "models, the paper's setting; only the scenarios under adapters.scenarios have "
            "adapters"
        ),
    ),
    paper="95–99 % of full re-embedding Recall@10 / MRR, < 10 µs added query latency",
    missing="no query-side Drift-Adapter kind was fitted (adapters.scenarios, adapters.heads)",
)
def drift_adapter_recovers_reindexing(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    adapters = query_adapters(sc, DRIFT_ADAPTER_QUERY_KINDS)
    for strategy in dict.fromkeys(a.strategy for a in adapters):
        fits = [a for a in adapters if a.strategy == strategy]
        own = sc.value(strategy, SELF)
        if own is None:
            continue
        best = max(fits, key=lambda a: a.row.value)
        share = best.row.value / own if own else math.nan
        old_self = sc.evaluation.old_self
        gap = own - old_self
        closed = (best.row.value - old_self) / gap if gap > 0 else math.nan
        each = ", ".join(
            f"{a.kind} {100 * a.row.value / own:.1f} %" if own else f"{a.kind} –" for a in fits
        )
        premise = (
            "premise not measured: M(old, old) is missing"
            if math.isnan(old_self)
            else ""
            if old_self >= COMPARABLE_PAIR * own
            else f"premise: the old model reaches {100 * old_self / own:.1f} % of the new one's M "
            f"(Drift-Adapter's upgrades: models of comparable quality, here ≥ "
            f"{100 * COMPARABLE_PAIR:.0f} %)"
        )
        # The share of the old→new gap closed, beside the share of M(new, new): none where the
        # old model is as good as the new one (no gap to close).
        has_gap = math.isfinite(closed)
        gap_text = f"; {100 * closed:.1f} % of the old→new gap" if has_gap else ""
        closed_text = (
            f", {100 * closed:.1f} % of the gap from M(old, old) = {old_self:.4f} closed"
            if has_gap
            else f", no gap from M(old, old) = {old_self:.4f} to close"
        )
        yield Check(
            key=f"{sc.name}: best query-side adapter, % of M({strategy}, {strategy})",
            margin=100 * (share - DRIFT_ADAPTER_RECOVERY),
            ours=(
                f"{sc.name}: {100 * share:.1f} % ({best.kind}, {best.sample_size} pairs{gap_text})"
            ),
            evidence=(
                f"{sc.name}: best query-side adapter {best.name} M = {best.row.value:.4f} vs "
                f"M({strategy}, {strategy}) = {own:.4f}: {100 * share:.1f} % on "
                f"{best.sample_size} pairs{closed_text} (each kind: {each})"
            ),
            compared=(100 * share, 100 * closed) if has_gap else (100 * share,),
            systems=(sc.evaluation.old_model, new_model_name(strategy), best.name),
            digits=1,
            excluded=premise,
            query_se=joint_bootstrap_se(
                [
                    sc.per_query_ap(best.row.query_set, best.row.gallery_set),
                    sc.per_query_ap(new_model_name(strategy), new_model_name(strategy)),
                ],
                lambda adapted, own: 100 * adapted / own,
            ),
        )


@claim_entry(
    statement=(
        "Blending the Procrustes-aligned new query with the old model's query along the sphere "
        "(SLERP) is backward compatible, M(SLERP, old) > M(old, old), and beats the Procrustes "
        "alignment alone, M(SLERP, old) > M(Procrustes, old)."
    ),
    source=(
        "SLERP backward compatibility (Ricci, Biondi, Pernici, NeurIPS 2026; "
        "miccunifi/SLERP_backward_compatibility README)"
    ),
    scope=Scope(
        scenarios=ALL_SCENARIO_KINDS,
        metric="the scenario's headline metric (R@1 of image-text retrieval in the paper)",
        protocol=(
            "the query embedded by both models, the aligned new query blended with the old one "
            "by α chosen on a held-out support fifth of the fitting pairs (as the paper picks α "
            "on a support set), against the old gallery; fitted on the largest sample. The "
            "paper's: CLIP and SigLIP pairs on Flickr30k, COCO and NoCaps"
        ),
        elsewhere=(
            "none: every scenario kind here is an upgrade between two independently trained "
            "models; only the scenarios under adapters.scenarios have adapters"
        ),
    ),
    paper=(
        "backward compatibility in 85/90 settings vs 45/90 for Procrustes alone; Flickr30k "
        "I2T R@1 CLIP L/14→B/32: old 40.62, Procrustes 42.89, SLERP 48.00 (new/new 48.73)"
    ),
    missing="no SLERP query adapter was fitted (adapters.scenarios, adapters.heads)",
)
def slerp_is_backward_compatible(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    old_self = sc.evaluation.old_self
    adapters = query_adapters(sc, (SLERP_KIND, PROCRUSTES_QUERY_KIND))
    for slerp in (a for a in adapters if a.kind == SLERP_KIND):
        slerp_up = Measured(
            f"M({slerp.name}, old)", slerp.row.value, (slerp.row.query_set, slerp.row.gallery_set)
        )
        old_old = Measured("M(old, old)", old_self, old_pair(sc))
        systems = (sc.evaluation.old_model, new_model_name(slerp.strategy), slerp.name)
        yield versus(sc, slerp_up, old_old, systems, shown_as="old ")
        for procrustes in adapters:
            if procrustes.kind != PROCRUSTES_QUERY_KIND or procrustes.strategy != slerp.strategy:
                continue
            procrustes_up = Measured(
                f"M({procrustes.name}, old)",
                procrustes.row.value,
                (procrustes.row.query_set, procrustes.row.gallery_set),
            )
            pairs = f" ({slerp.sample_size} pairs)"
            systems_both = (*systems, procrustes.name)
            yield versus(sc, slerp_up, procrustes_up, systems_both, "Procrustes ", pairs)
