"""What several claims' checks share: names of the evaluated models, query-bootstrap errors, the
best new-to-old search, the adapters fitted, AUC comparisons of two curves."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from modelupgrade.backfill.summary import CurveSummary
from modelupgrade.evaluation.summary import (
    REVERSE_ADAPTER,
    ComparisonRow,
)
from modelupgrade.layout import new_model_name
from modelupgrade.report.claims.checks import (
    Check,
    CurveRef,
)
from modelupgrade.report.claims.vocabulary import (
    CURVE_METRICS,
)
from modelupgrade.report.results import ScenarioResults
from modelupgrade.report.statistics import (
    joint_bootstrap_se,
)


def curve_system(sc: ScenarioResults, system: str) -> str:
    """The model or head a backfill curve's system is: a head's by its own name, a strategy's
    plain model by the model's."""
    return system if system in sc.head_systems else new_model_name(system)


def old_pair(sc: ScenarioResults) -> tuple[str, str]:
    """M(old, old)'s evaluation pair."""
    return (sc.evaluation.old_model, sc.evaluation.old_model)


def difference_se(sc: ScenarioResults, first: tuple[str, str], second: tuple[str, str]) -> float:
    """The query-bootstrap standard error of M(first) − M(second), two pairs of one evaluation."""
    return joint_bootstrap_se(
        [sc.per_query_ap(*first), sc.per_query_ap(*second)], lambda a, b: a - b
    )


class Measured(NamedTuple):
    """One number of an evaluation as a check names it: ``name`` (e.g. "M(BCT, old)"), its value
    and the (query set, gallery set) pair it was measured on."""

    name: str
    value: float
    pair: tuple[str, str]


def versus(
    sc: ScenarioResults,
    first: Measured,
    second: Measured,
    systems: tuple[str, ...],
    shown_as: str = "",
    note: str = "",
) -> Check:
    """The check that ``first`` exceeds ``second`` on one scenario: its margin is their difference
    and its query-bootstrap error that difference's; the table shows "first vs {shown_as}second"."""
    return Check(
        key=f"{sc.name}: {first.name} vs {second.name}",
        margin=first.value - second.value,
        ours=f"{sc.name}: {first.value:.4f} vs {shown_as}{second.value:.4f}",
        evidence=(
            f"{sc.name}: {first.name} = {first.value:.4f} vs {second.name} = "
            f"{second.value:.4f}{note}"
        ),
        compared=(first.value, second.value),
        systems=systems,
        query_se=difference_se(sc, first.pair, second.pair),
    )


def label(strategy: str) -> str:
    return strategy.upper()


def best_up(rows: Sequence[ComparisonRow]) -> ComparisonRow:
    """The row of the largest Δ↑ (a NaN one only when every one is NaN)."""
    return max(rows, key=lambda r: -math.inf if math.isnan(r.delta_up_pct) else r.delta_up_pct)


class FittedAdapter(NamedTuple):
    """A query-side adapter's row of the evaluation, with its kind and sample size."""

    strategy: str
    name: str
    kind: str
    sample_size: int
    row: ComparisonRow


def query_adapters(sc: ScenarioResults, kinds: Sequence[str]) -> list[FittedAdapter]:
    """The scenario's query-side adapters of ``kinds`` fitted on the largest sample of each
    strategy (the evaluation's sources record each fit's kind and sample size)."""
    found = []
    for strategy in sc.evaluation.strategies:
        for row in sc.rows(strategy):
            if row.comparison != REVERSE_ADAPTER or row.head_set is None:
                continue
            name = row.head_set.split("(")[0]
            info = sc.evaluation.sources.get(name, {})
            kind, size = info.get("kind"), info.get("sample_size")
            if isinstance(kind, str) and kind in kinds and isinstance(size, int):
                found.append(FittedAdapter(strategy, name, kind, size, row))
    largest = {
        s: max(a.sample_size for a in found if a.strategy == s) for s in {a.strategy for a in found}
    }
    return [a for a in found if a.sample_size == largest[a.strategy]]


def paired_strategy(sc: ScenarioResults, system: str) -> str:
    """The strategy whose plain rank merge a head's system is compared with (itself if none)."""
    return sc.head_systems.get(system, system)


def larger_auc(
    sc: ScenarioResults,
    curve: CurveSummary,
    other: CurveSummary,
    kind: str,
    measure: str,
    other_name: str,
    ours_name: str = "",
) -> Iterator[Check]:
    """One check per curve metric: ``curve``'s AUC of ``kind`` above ``other``'s."""
    ours_aucs, their_aucs = curve.auc(kind), other.auc(kind)
    for metric in CURVE_METRICS:
        if metric not in ours_aucs or metric not in their_aucs:
            continue
        ours, theirs = ours_aucs[metric], their_aucs[metric]
        yield Check(
            key=f"{sc.name} {curve.strategy}: {measure} {metric} {ours_name}vs {other_name}",
            margin=ours - theirs,
            ours=f"{sc.name}: {metric} {ours:.4f} vs {theirs:.4f}",
            evidence=(
                f"{sc.name} {curve.strategy}: {measure} {metric} {ours_name}{ours:.4f} "
                f"vs {other_name} {theirs:.4f}"
            ),
            compared=(ours, theirs),
            systems=(
                sc.evaluation.old_model,
                *(curve_system(sc, c.strategy) for c in (curve, other)),
            ),
            query_se=joint_bootstrap_se(
                [
                    sc.per_query_auc(c.strategy, c.policy, c.mode, metric, kind)
                    for c in (curve, other)
                ],
                lambda a, b: a - b,
            ),
            curves=tuple(
                CurveRef(sc.name, c.strategy, c.policy, c.mode, metric) for c in (curve, other)
            ),
        )
