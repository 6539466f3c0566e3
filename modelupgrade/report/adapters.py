"""The report's section on the training-free adapters of a scenario: each adapter beside the
trained heads and the compatible strategies, as a share of M(new, new) and of the old → new gap."""

from __future__ import annotations

import math
from typing import Any

from modelupgrade.evaluation.summary import (
    ADAPTER_COMPARISONS,
    BACKWARD,
    HEAD_COMPARISONS,
    REVERSE_ADAPTER,
    REVERSE_HEAD,
    SELF,
    ComparisonRow,
)
from modelupgrade.report.document import Block, Heading, Paragraph, Table
from modelupgrade.report.numbers import M_DIGITS, PERCENT_DIGITS, fixed
from modelupgrade.report.results import ScenarioResults

M, PCT = M_DIGITS, PERCENT_DIGITS


def _percent(value: float, reference: float | None) -> float | None:
    """``value`` as a percentage of ``reference`` (None where there is no reference)."""
    if reference is None or not math.isfinite(reference) or reference == 0:
        return None
    return 100.0 * value / reference


def _gap_closed(value: float, old: float | None, new: float | None) -> float | None:
    """The share (%) of the way from M(old, old) to M(new, new) that ``value`` covers (None
    where the new model is no better than the old)."""
    if old is None or new is None or not math.isfinite(old) or not new > old:
        return None
    return 100.0 * (value - old) / (new - old)


def adapter_blocks(sc: ScenarioResults) -> list[Block]:
    """The training-free adapters beside the trained heads and the compatible strategies: how
    much of M(new, new) each way of serving the new model without re-embedding the gallery
    recovers. Nothing when the scenario has no adapter."""
    ev = sc.evaluation
    adapters = [
        (strategy, row)
        for strategy in ev.strategies
        for row in sc.rows(strategy)
        if row.comparison in ADAPTER_COMPARISONS
    ]
    if not adapters:
        return []
    rows = _adapter_rows(sc, adapters) + _trained_rows(sc)
    return [
        Heading(f"Training-free adapters ({sc.name})", 3),
        _adapters_paragraph(sc),
        Table(
            [
                "system",
                "kind",
                "side mapped",
                "pairs",
                f"M ({sc.metric})",
                "% of own M(new, new)",
                "% of independent M(new, new)",
                "% of the old → new gap",
                "Δ↑ % (vs old, old)",
                "flip rate",
            ],
            rows,
            digits=(0, 0, 0, 0, M, PCT, PCT, PCT, PCT, M),
        ),
    ]


def _own_self(sc: ScenarioResults, strategy: str) -> float | None:
    """M(new, new) of ``strategy``'s own new model."""
    row = sc.row(strategy, SELF)
    return row.value if row else None


def _adapter_line(
    sc: ScenarioResults,
    name: str,
    kind: str,
    side: str,
    pairs: Any,
    strategy: str,
    row: ComparisonRow,
) -> list[Any]:
    """One row of the adapters' table."""
    ev = sc.evaluation
    return [
        name,
        kind,
        side,
        pairs,
        row.value,
        _percent(row.value, _own_self(sc, strategy)),
        _percent(row.value, ev.oracle_self),
        _gap_closed(row.value, ev.old_self, _own_self(sc, strategy)),
        row.delta_up_pct,
        row.negative_flip_rate,
    ]


def _adapter_rows(
    sc: ScenarioResults, adapters: list[tuple[str, ComparisonRow]]
) -> list[list[Any]]:
    """The fitted adapters' rows: by adapter kind, then strategy, then sample size."""
    sources = sc.evaluation.sources

    def fitted(item: tuple[str, ComparisonRow]) -> tuple[str, str, float]:
        strategy, row = item
        name = (row.head_set or "").split("(")[0]
        size = sources.get(name, {}).get("sample_size")  # recorded for a training-free adapter
        return (name.split(".")[0], strategy, size if isinstance(size, int) else math.inf)

    rows = []
    for strategy, row in sorted(adapters, key=fitted):
        name = (row.head_set or "").split("(")[0]
        info = sources.get(name, {})
        side = "query" if row.comparison == REVERSE_ADAPTER else "gallery (vectors)"
        kind = info.get("kind")
        shown = kind if isinstance(kind, str) else "–"
        rows.append(_adapter_line(sc, name, shown, side, info.get("sample_size"), strategy, row))
    return rows


def _trained_rows(sc: ScenarioResults) -> list[list[Any]]:
    """The rows the adapters are compared with: the trained heads and each strategy's new model
    searching the old gallery."""
    ev = sc.evaluation
    rows = []
    for strategy in ev.strategies:
        for row in sc.rows(strategy):
            if row.comparison in HEAD_COMPARISONS:
                name = (row.head_set or "").split("(")[0]
                side = "query" if row.comparison == REVERSE_HEAD else "gallery (vectors)"
                rows.append(
                    _adapter_line(sc, name, "trained head", side, "all + labels", strategy, row)
                )
            elif row.comparison == BACKWARD:
                kind = "none (independent)" if ev.oracle == row.query_set else "compatible training"
                system = f"{strategy}: new model, old gallery"
                rows.append(_adapter_line(sc, system, kind, "none", "–", strategy, row))
    return rows


def _adapters_paragraph(sc: ScenarioResults) -> Paragraph:
    """What the adapters' table compares, and its reference values."""
    ev = sc.evaluation
    old_self, oracle_self = fixed(ev.old_self), fixed(ev.oracle_self)
    return Paragraph(
        "Drift-Adapter's three adapters (orthogonal Procrustes, low-rank affine, residual "
        "MLP), their local forms (Local Drift-Adapters: a map per k-means cluster, softly "
        "blended), query drift compensation and SLERP (its α tuned on a support split), each "
        "fitted on a sample of paired training embeddings (the old and the new "
        "model's vectors of the same images; no labels, neither model retrained), beside the "
        "trained heads and the compatibility-trained strategies. Query side: the new model's "
        "query mapped into the old space searches the stored old gallery, nothing is "
        "backfilled (SLERP also needs the old model's embedding of the query). Gallery side: "
        "the stored old vectors are mapped into the new space once, a backfill of vectors "
        "only. 'of own M(new, new)' is M as a percentage of what re-embedding the whole "
        "gallery with the same new model gives (Drift-Adapter's measure); 'of the gap' the "
        "share of the way from M(old, old) to that M(new, new) it closes; 'of independent' "
        "the same "
        f"against the independently trained new model ({oracle_self}). M(old, old) = "
        f"{old_self}."
    )
