"""Do the papers' claims hold here? Seven claims, each checked wherever the study has the numbers.

A claim holds only where it holds on every scenario that measured it; a study without the numbers
for a claim leaves it untested, and so does a NaN among them (a number not measured, never a loss).
The strategies a claim is about are found by their kind in params (``StudyResults.strategy_kinds``),
the head systems of the backfill study by the scenario's heads.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from modelupgrade.evaluation.summary import BACKWARD, FORWARD_HEAD, SELF
from modelupgrade.report.results import CURVE_METRIC, ScenarioResults, StudyResults

# The strategy kinds (``strategies.<name>.kind``) the claims are about.
BCT_KIND = "bct"
DMU_KIND = "dmu"
# Ordering policies and serving modes of the backfill study (``backfill.policies``,
# ``backfill.serving_modes``) the claims compare.
RANDOM_ORDER = "random"
UNCERTAINTY_ORDER = "fastfill-uncertainty"
MIXED = "mixed"
RANK_MERGE = "rank-merge"
REVERSE_RANK_MERGE = "rank-merge-rqt"
# Where the reverse-transform claim compares the rank merges: half the gallery backfilled.
HALF_WAY = 0.5


class Check(NamedTuple):
    """One check of a claim on one scenario: whether it holds there, the evidence, and the numbers
    it compared. A NaN among them makes ``holds`` meaningless (every comparison with NaN is False):
    ``_claim`` leaves such a check out of the verdict."""

    holds: bool
    evidence: str
    compared: tuple[float, ...]

    @property
    def measured(self) -> bool:
        return not any(math.isnan(number) for number in self.compared)


ScenarioChecks = Callable[[StudyResults, ScenarioResults], Iterator[Check]]


@dataclass(frozen=True)
class Claim:
    statement: str
    holds: bool | None  # None: this study has no evidence either way
    evidence: str

    @property
    def verdict(self) -> str:
        return {True: "holds", False: "does not hold", None: "not tested"}[self.holds]


def check_claims(study: StudyResults) -> list[Claim]:
    """Each of the papers' claims, checked wherever this study has the numbers for it."""
    return [claim(study) for claim in CLAIMS]


def _claim(
    statement: str, missing: str
) -> Callable[[ScenarioChecks], Callable[[StudyResults], Claim]]:
    """A claim from its checks on each scenario: it holds where every measured check holds; no
    check, not tested (``missing`` says why), nor where no check was measured (a NaN number)."""

    def from_checks(checks_of: ScenarioChecks) -> Callable[[StudyResults], Claim]:
        @functools.wraps(checks_of)
        def claim(study: StudyResults) -> Claim:
            checks = [check for sc in study.scenarios for check in checks_of(study, sc)]
            measured = [check.holds for check in checks if check.measured]
            holds = all(measured) if measured else None
            evidence = "; ".join(
                check.evidence if check.measured else f"{check.evidence} (not measured)"
                for check in checks
            )
            return Claim(statement, holds, evidence or missing)

        return claim

    return from_checks


def _label(strategy: str) -> str:
    return strategy.upper()


@_claim(
    "BCT is backward compatible: M(φ_new^BCT, φ_old) > M(φ_old, φ_old).",
    "BCT was not evaluated",
)
def bct_is_backward_compatible(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    old_self = sc.evaluation.old_self
    for bct in study.strategies_of_kind(BCT_KIND):
        cross = sc.value(bct, BACKWARD)
        if cross is not None and old_self is not None:
            evidence = (
                f"{sc.name}: M({_label(bct)}, old) = {cross:.4f} vs M(old, old) = {old_self:.4f}"
            )
            yield Check(cross > old_self, evidence, (cross, old_self))


@_claim(
    "BCT loses new-to-new accuracy against the independently trained new model.",
    "BCT or the independent model was not evaluated",
)
def bct_loses_new_to_new_accuracy(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    oracle_self = sc.evaluation.oracle_self
    for bct in study.strategies_of_kind(BCT_KIND):
        bct_self = sc.value(bct, SELF)
        if bct_self is not None and oracle_self is not None:
            label = _label(bct)
            evidence = (
                f"{sc.name}: M({label}, {label}) = {bct_self:.4f} vs independent {oracle_self:.4f}"
            )
            yield Check(bct_self < oracle_self, evidence, (bct_self, oracle_self))


@_claim("DMU narrows BCT's new-to-new loss (smaller Δ↓).", "BCT or DMU was not evaluated")
def dmu_narrows_bct_loss(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    for bct_name in study.strategies_of_kind(BCT_KIND):
        for dmu_name in study.strategies_of_kind(DMU_KIND):
            bct, dmu = sc.row(bct_name, SELF), sc.row(dmu_name, SELF)
            if bct is None or dmu is None:
                continue
            ours, theirs = dmu.delta_down_pct, bct.delta_down_pct
            evidence = (
                f"{sc.name}: Δ↓ {_label(dmu_name)} {ours:.2f}% vs {_label(bct_name)} {theirs:.2f}%"
            )
            yield Check(ours < theirs, evidence, (ours, theirs))


@_claim(
    "Forward adapters ψ raise new-to-old retrieval: M(new, ψ(old)) above M(new, old) for "
    "compatible new models, and above M(old, old) for an independent one (FCT).",
    "no forward head was evaluated",
)
def forward_adapters_raise_new_to_old(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    old_self = sc.evaluation.old_self
    for strategy in sc.evaluation.strategies:
        backward = sc.value(strategy, BACKWARD)
        if backward is None or old_self is None:
            continue
        for row in sc.rows(strategy):
            if row.comparison != FORWARD_HEAD:
                continue
            # An incompatible (independent) new model is measured against old/old, as FCT does.
            if sc.evaluation.oracle == row.query_set:
                reference, label = old_self, "M(old, old)"
            else:
                reference, label = backward, f"M({strategy}, old)"
            evidence = (
                f"{sc.name}: M({row.query_set}, {row.gallery_set}) = "
                f"{row.value:.4f} vs {label} = {reference:.4f}"
            )
            yield Check(row.value > reference, evidence, (row.value, reference))


@_claim(
    "Reverse query transforms (RQT/MCL) make rank merge beat the naive two-model merge at t = 0.5.",
    "no reverse transform was simulated",
)
def reverse_transforms_beat_naive_merge(
    study: StudyResults, sc: ScenarioResults
) -> Iterator[Check]:
    systems = {c.strategy for c in sc.backfill_curves() if c.mode == REVERSE_RANK_MERGE}
    for system in sorted(systems):
        base = _paired_strategy(sc, system)
        with_head = sc.curve_value(system, RANDOM_ORDER, REVERSE_RANK_MERGE, HALF_WAY)
        naive = sc.curve_value(base, RANDOM_ORDER, RANK_MERGE, HALF_WAY)
        if with_head is not None and naive is not None:
            evidence = (
                f"{sc.name}: {system} rank merge at t = {HALF_WAY}: {CURVE_METRIC} "
                f"{with_head:.4f} vs naive two-model merge {naive:.4f}"
            )
            yield Check(with_head > naive, evidence, (with_head, naive))


@_claim(
    "Distance rank merge gives a monotone backfill curve (Seo et al.'s third condition, mAP).",
    "no rank-merge curve was simulated",
)
def rank_merge_is_monotone(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    for curve in sc.backfill_curves():
        if curve.mode != RANK_MERGE or not curve.deployable:
            continue
        conditions = curve.conditions[CURVE_METRIC]
        shape = "monotone" if conditions.monotone else f"largest drop {conditions.largest_drop:.4f}"
        evidence = f"{sc.name} {curve.strategy}/{curve.policy}: {shape}"
        # A NaN point of the curve makes it "not monotone" with a NaN largest drop.
        yield Check(conditions.monotone, evidence, (conditions.largest_drop,))


@_claim(
    "FastFill's σ² order backfills better than a random order for the same adapter (AUC of mAP).",
    "no FastFill adapter was simulated",
)
def uncertainty_order_beats_random(study: StudyResults, sc: ScenarioResults) -> Iterator[Check]:
    auc = sc.primary_auc
    for curve in sc.backfill_curves():
        if (curve.policy, curve.mode) != (UNCERTAINTY_ORDER, MIXED):
            continue
        random_order = sc.curve(curve.strategy, RANDOM_ORDER, MIXED)
        if random_order is None:
            continue
        ours, theirs = curve.auc(auc)[CURVE_METRIC], random_order.auc(auc)[CURVE_METRIC]
        evidence = (
            f"{sc.name} {curve.strategy}: AUC {CURVE_METRIC} σ² order {ours:.4f} "
            f"vs random {theirs:.4f}"
        )
        yield Check(ours > theirs, evidence, (ours, theirs))


def _paired_strategy(sc: ScenarioResults, system: str) -> str:
    """The strategy whose plain rank merge a head's system is compared with (itself if none)."""
    return sc.head_systems.get(system, system)


CLAIMS: tuple[Callable[[StudyResults], Claim], ...] = (
    bct_is_backward_compatible,
    bct_loses_new_to_new_accuracy,
    dmu_narrows_bct_loss,
    forward_adapters_raise_new_to_old,
    reverse_transforms_beat_naive_merge,
    rank_merge_is_monotone,
    uncertainty_order_beats_random,
)
