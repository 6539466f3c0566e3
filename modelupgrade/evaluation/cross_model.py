"""The cross-model matrix M(φ_q, φ_g) over named embedding sets, and the per-strategy summary.

Embedding sets are named: a model (``gen0``, ``gen1-bct``), a forward head applied to the old
gallery (``bict-bct(gen0)``), a reverse head applied to new queries (``rqt-bct(gen1-bct)``). The
matrix is a tidy table with one row per (query set, gallery set, metric). Negative flips of every
pair are counted against one reference pair (the old system, old/old).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from modelupgrade.errors import UserError
from modelupgrade.evaluation.retrieval import PairResult, RetrievalEvaluator
from modelupgrade.evaluation.summary import Compatibility
from modelupgrade.io import atomic_path
from modelupgrade.metrics import (
    compatibility_summary,
    degradation,
    negative_flip_rate,
    upgrade_gain,
)

log = logging.getLogger(__name__)

MATRIX_COLUMNS = ["query_set", "gallery_set", "metric", "value"]
NFR_METRIC = "negative_flip_rate"


@dataclass(frozen=True)
class StrategyComparisons:
    """The embedding sets one strategy is judged by."""

    strategy: str
    new: str
    forward_galleries: tuple[str, ...] = ()  # ψ(old) gallery sets queried by ``new``
    reverse_queries: tuple[str, ...] = ()  # ψ_rev(new) query sets against the old gallery
    # The same made by training-free adapters (gallery side, query side).
    forward_adapters: tuple[str, ...] = ()
    reverse_adapters: tuple[str, ...] = ()


@dataclass
class CrossModelResult:
    table: pd.DataFrame
    correct: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    info: dict[tuple[str, str], dict] = field(default_factory=dict)
    # Per pair, each query's AP (``PairResult.average_precision``): what a comparison of two pairs'
    # mAP is weighed against, query by query.
    average_precision: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)

    def per_query_table(self) -> pd.DataFrame:
        """Each pair's per-query AP as rows (query_set, gallery_set, query, ap)."""
        parts = [
            pd.DataFrame(
                {
                    "query_set": q,
                    "gallery_set": g,
                    "query": np.arange(len(ap), dtype=np.int32),
                    "ap": ap,
                }
            )
            for (q, g), ap in self.average_precision.items()
        ]
        columns = ["query_set", "gallery_set", "query", "ap"]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)

    def value(self, query_set: str, gallery_set: str, metric: str) -> float:
        rows = self.table[
            (self.table.query_set == query_set)
            & (self.table.gallery_set == gallery_set)
            & (self.table.metric == metric)
        ]
        return float(rows.value.iloc[0]) if len(rows) else float("nan")

    def wide(self) -> pd.DataFrame:
        """One row per pair, one column per metric."""
        return self.table.pivot_table(
            index=["query_set", "gallery_set"], columns="metric", values="value", sort=False
        ).reset_index()


def all_compatible_pairs(
    query_sets: Mapping[str, np.ndarray], gallery_sets: Mapping[str, np.ndarray]
) -> list[tuple[str, str]]:
    """Every (query set, gallery set) whose embedding dimensions agree."""
    return [
        (q, g)
        for q, qv in query_sets.items()
        for g, gv in gallery_sets.items()
        if qv.shape[1] == gv.shape[1]
    ]


def essential_pairs(
    old: str, comparisons: Sequence[StrategyComparisons], oracle: str | None
) -> list[tuple[str, str]]:
    pairs = [(old, old)]
    for c in comparisons:
        pairs += [(c.new, c.new), (c.new, old)]
        pairs += [(c.new, g) for g in (*c.forward_galleries, *c.forward_adapters)]
        pairs += [(q, old) for q in (*c.reverse_queries, *c.reverse_adapters)]
    if oracle is not None:
        pairs.append((oracle, oracle))
    return list(dict.fromkeys(pairs))


def cross_model_matrix(
    evaluator: RetrievalEvaluator,
    query_sets: Mapping[str, np.ndarray],
    gallery_sets: Mapping[str, np.ndarray],
    pairs: Iterable[tuple[str, str]],
    reference: tuple[str, str] | None = None,
) -> CrossModelResult:
    """Evaluate each pair; with ``reference`` also the negative-flip rate of
    every pair against it."""
    pairs = list(dict.fromkeys(pairs))
    if reference is not None and reference not in pairs:
        pairs.insert(0, reference)
    rows: list[tuple[str, str, str, float]] = []
    results: dict[tuple[str, str], PairResult] = {}
    for q, g in pairs:
        if q not in query_sets or g not in gallery_sets:
            missing = q if q not in query_sets else g
            raise UserError(
                f"no embedding set named {missing!r}",
                hint=f"query sets: {sorted(query_sets)}; gallery sets: {sorted(gallery_sets)}",
            )
        result = evaluator.evaluate(query_sets[q], gallery_sets[g])
        results[(q, g)] = result
        rows += [(q, g, name, float(value)) for name, value in result.metrics.items()]
        log.info("%s → %s: %s", q, g, ", ".join(f"{k}={v:.4f}" for k, v in result.metrics.items()))
    if reference is not None:
        baseline = results[reference].correct
        rows += [
            (q, g, NFR_METRIC, negative_flip_rate(baseline, r.correct))
            for (q, g), r in results.items()
        ]
    table = pd.DataFrame(rows, columns=MATRIX_COLUMNS)
    return CrossModelResult(
        table,
        {k: r.correct for k, r in results.items()},
        {k: r.info for k, r in results.items()},
        {k: r.average_precision for k, r in results.items() if r.average_precision is not None},
    )


def self_scores(result: CrossModelResult, sets: Iterable[str], metric: str) -> dict[str, float]:
    """M(set, set) of each embedding set: its self-test."""
    return {name: result.value(name, name, metric) for name in sets}


def delta_down(scores: Mapping[str, float], oracle_scores: Mapping[str, float]) -> dict[str, float]:
    """Δ↓ (DMU Eq. 7, percent) of each embedding set: its self-test against the oracle's score for
    it. The one place Δ↓ is computed: a two-model scenario compares every new model with the one
    oracle model, a sequential chain each generation with the oracle chain's same generation. Sets
    without an oracle score, or whose Δ↓ cannot be measured (an oracle scoring 0), are left out."""
    found = {}
    for name, score in scores.items():
        if name in oracle_scores:
            value = degradation(score, oracle_scores[name])
            if math.isfinite(value):
                found[name] = value
    return found


def strategy_summary(
    result: CrossModelResult,
    old: str,
    comparisons: Sequence[StrategyComparisons],
    delta_down_pct: Mapping[str, float],
    metric: str,
) -> pd.DataFrame:
    """Δ↑ (DMU Eq. 6), Δ↓ (DMU Eq. 7) and the negative-flip rate per strategy and comparison.

    Δ↑ compares each way of searching the old gallery with the upgraded model (new/old,
    new/ψ(old), ψ_rev(new)/old, the same through training-free adapters) against old/old; Δ↓ is
    the new model's, from ``delta_down``.
    """
    old_self = result.value(old, old, metric)
    rows = []
    for c in comparisons:
        delta = delta_down_pct.get(c.new, float("nan"))
        candidates = [("self", c.new, c.new), ("backward", c.new, old)]
        candidates += [("forward-head", c.new, g) for g in c.forward_galleries]
        candidates += [("reverse-head", q, old) for q in c.reverse_queries]
        candidates += [("forward-adapter", c.new, g) for g in c.forward_adapters]
        candidates += [("reverse-adapter", q, old) for q in c.reverse_adapters]
        for comparison, q, g in candidates:
            value = result.value(q, g, metric)
            rows.append(
                {
                    "strategy": c.strategy,
                    "comparison": comparison,
                    "query_set": q,
                    "gallery_set": g,
                    "metric": metric,
                    "value": value,
                    "delta_up_pct": float("nan")
                    if comparison == "self"
                    else upgrade_gain(value, old_self),
                    "delta_down_pct": delta,
                    NFR_METRIC: result.value(q, g, NFR_METRIC),
                }
            )
    return pd.DataFrame(rows)


def compatibility_matrix(
    result: CrossModelResult, generations: Sequence[str], metric: str
) -> np.ndarray:
    """T × T matrix M[i, j] = metric(query generation i, gallery generation j), j ≤ i (0 above)."""
    t = len(generations)
    matrix = np.zeros((t, t))
    for i, q in enumerate(generations):
        for j, g in enumerate(generations[: i + 1]):
            matrix[i, j] = result.value(q, g, metric)
    return matrix


def sequential_summary(
    result: CrossModelResult, generations: Sequence[str], metric: str
) -> Compatibility:
    matrix = compatibility_matrix(result, generations, metric)
    return Compatibility(
        generations=list(generations),
        metric=metric,
        matrix=matrix.tolist(),
        **compatibility_summary(matrix),
    )


def write_heatmap(
    result: CrossModelResult,
    metrics: Sequence[str],
    path: str | Path,
    query_order: Sequence[str] | None = None,
    gallery_order: Sequence[str] | None = None,
    title: str = "",
) -> None:
    """One heatmap panel per metric: rows = query sets, columns = gallery sets,
    blank = not evaluated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = result.table
    metrics = [m for m in metrics if m in set(table.metric)]
    if not metrics:
        raise UserError(
            "none of the heatmap metrics was computed",
            hint=f"computed metrics: {sorted(set(table.metric))}",
        )
    queries = list(query_order or dict.fromkeys(table.query_set))
    galleries = list(gallery_order or dict.fromkeys(table.gallery_set))
    fig, axes = plt.subplots(
        1,
        len(metrics),
        figsize=(1.2 + 1.1 * len(galleries) * len(metrics) + 2, 1.5 + 0.55 * len(queries)),
        squeeze=False,
    )
    for ax, metric in zip(axes[0], metrics, strict=True):
        grid = (
            table[table.metric == metric]
            .pivot(index="query_set", columns="gallery_set", values="value")
            .reindex(index=queries, columns=galleries)
        )
        values = grid.to_numpy(dtype=float)
        image = ax.imshow(np.ma.masked_invalid(values), cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(galleries)), galleries, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(queries)), queries, fontsize=8)
        ax.set_xlabel("gallery embeddings")
        ax.set_ylabel("query embeddings")
        ax.set_title(metric)
        for (i, j), v in np.ndenumerate(values):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.3f}", ha="center", va="center", fontsize=7, color="white")
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
