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
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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


# The heatmap is drawn to be read at 100 % in the report's text column (about 1,100 px wide in a
# 1,400-px browser window): at this resolution a point of text is 100/72 px.
HEATMAP_DPI = 100
HEATMAP_MAX_WIDTH_PX = 1100
# Text sizes in points: tick labels and the values in the cells (12.5 and 11 px at HEATMAP_DPI).
LABEL_POINTS = 9.0
CELL_POINTS = 8.0
# A cell's width in inches: as wide as a value needs at CELL_POINTS, wider where the columns fit.
CELL_INCHES = (0.62, 0.9)
CELL_HEIGHT_INCHES = 0.34
# Room for the axis title and the colour bar, and the inches a character of a label takes at
# LABEL_POINTS (the query sets' names on the left; the gallery sets', rotated 40°, below).
AXIS_TITLE_INCHES = 0.5
COLORBAR_INCHES = 1.0
CHARACTER_INCHES = 0.072


@dataclass(frozen=True)
class HeatmapPanel:
    """One panel of the heatmap: a metric over some query sets (rows) and gallery sets (columns)."""

    metric: str
    title: str
    queries: tuple[str, ...]
    galleries: tuple[str, ...]


def is_head_set(name: str) -> bool:
    """An embedding set a head or adapter made (``fct-independent(gen0)``), not a model's own."""
    return "(" in name


def heatmap_panels(
    evaluated: set[tuple[str, str]],
    metrics: Sequence[str],
    queries: Sequence[str],
    galleries: Sequence[str],
) -> list[HeatmapPanel]:
    """The panels of a heatmap, per metric: the models' own embedding sets against each other, the
    models' queries against the galleries a head or adapter transformed (ψ(old)), and the queries a
    head or adapter transformed (ψ_rev(new)) against the galleries they searched; each over only the
    rows and columns it has values in, so that no pair is shown twice. A panel with more columns
    than fit ``HEATMAP_MAX_WIDTH_PX`` at the narrowest cell is cut into several."""
    parts = [
        ("models", lambda q, g: not is_head_set(q) and not is_head_set(g)),
        ("galleries through a head or adapter", lambda q, g: is_head_set(g) and not is_head_set(q)),
        ("queries through a head or adapter", lambda q, g: is_head_set(q)),
    ]
    # The panels share the figure's left margin, as wide as its longest query name: so do their
    # cells' room.
    most = max(1, int(_cell_room(queries) // CELL_INCHES[0]))
    panels = []
    for metric in metrics:
        for name, belongs in parts:
            pairs = {(q, g) for q, g in evaluated if belongs(q, g)}
            rows = [q for q in queries if any((q, g) in pairs for g in galleries)]
            columns = [g for g in galleries if any((q, g) in pairs for q in rows)]
            # As few panels as the columns need, the columns shared out evenly among them.
            count = math.ceil(len(columns) / most)
            size = math.ceil(len(columns) / max(count, 1))
            for k in range(count):
                chunk = tuple(columns[k * size : (k + 1) * size])
                part = f" ({k + 1}/{count})" if count > 1 else ""
                used = tuple(q for q in rows if any((q, g) in pairs for g in chunk))
                panels.append(HeatmapPanel(metric, f"{metric}: {name}{part}", used, chunk))
    return panels


def _label_inches(names: Iterable[str]) -> float:
    return CHARACTER_INCHES * max((len(name) for name in names), default=0)


def _cell_room(queries: Sequence[str]) -> float:
    """The inches the cells of a panel's row may take beside the query names and the colour bar."""
    width = HEATMAP_MAX_WIDTH_PX / HEATMAP_DPI
    return width - AXIS_TITLE_INCHES - _label_inches(queries) - COLORBAR_INCHES


def heatmap_figure(
    result: CrossModelResult,
    metrics: Sequence[str],
    query_order: Sequence[str] | None = None,
    gallery_order: Sequence[str] | None = None,
    title: str = "",
) -> Figure:
    """The cross-model heatmap (``heatmap_panels``), panels stacked: rows = query sets, columns =
    gallery sets, each cell's value written in it, blank = not evaluated. At most
    ``HEATMAP_MAX_WIDTH_PX`` wide at ``HEATMAP_DPI``, so that the report shows it unscaled."""
    from matplotlib.figure import Figure

    table = result.table
    metrics = [m for m in metrics if m in set(table.metric)]
    if not metrics:
        raise UserError(
            "none of the heatmap metrics was computed",
            hint=f"computed metrics: {sorted(set(table.metric))}",
        )
    queries = list(query_order or dict.fromkeys(table.query_set))
    galleries = list(gallery_order or dict.fromkeys(table.gallery_set))
    evaluated = {
        (q, g)
        for q, g, v in zip(table.query_set, table.gallery_set, table.value, strict=True)
        if math.isfinite(v)
    }
    panels = heatmap_panels(evaluated, metrics, queries, galleries)
    widest = max(len(p.galleries) for p in panels)
    room = _cell_room([q for p in panels for q in p.queries])
    cell = min(CELL_INCHES[1], max(CELL_INCHES[0], room / widest))
    most = HEATMAP_MAX_WIDTH_PX / HEATMAP_DPI
    width = min(most, cell * widest + most - room)
    # A rotated gallery name drops below its panel by about two thirds of its length.
    heights = [
        CELL_HEIGHT_INCHES * len(p.queries) + 0.66 * _label_inches(p.galleries) + 1.1
        for p in panels
    ]
    fig = Figure(
        figsize=(width, sum(heights) + (0.4 if title else 0.1)),
        dpi=HEATMAP_DPI,
        layout="constrained",
    )
    axes = fig.subplots(len(panels), 1, squeeze=False, height_ratios=heights)[:, 0]
    for ax, panel in zip(axes, panels, strict=True):
        grid = (
            table[table.metric == panel.metric]
            .pivot(index="query_set", columns="gallery_set", values="value")
            .reindex(index=list(panel.queries), columns=list(panel.galleries))
        )
        _draw_panel(fig, ax, grid.to_numpy(dtype=float), panel, cell)
    if title:
        fig.suptitle(title, fontsize=LABEL_POINTS + 2)
    return fig


def _draw_panel(fig: Figure, ax: Any, values: np.ndarray, panel: HeatmapPanel, cell: float) -> None:
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    finite = values[np.isfinite(values)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    # Every panel's cells the same size: a panel of few columns is narrower, not stretched.
    image = ax.imshow(
        np.ma.masked_invalid(values),
        cmap=cmap,
        aspect=CELL_HEIGHT_INCHES / cell,
        vmin=low,
        vmax=max(high, low + 1e-9),
    )
    ax.set_xticks(
        range(len(panel.galleries)),
        panel.galleries,
        rotation=40,
        ha="right",
        rotation_mode="anchor",
        fontsize=LABEL_POINTS,
    )
    ax.set_yticks(range(len(panel.queries)), panel.queries, fontsize=LABEL_POINTS)
    ax.set_xlabel("gallery embeddings", fontsize=LABEL_POINTS)
    ax.set_ylabel("query embeddings", fontsize=LABEL_POINTS)
    ax.set_title(panel.title, fontsize=LABEL_POINTS + 1)
    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            # Dark text on the light (yellow) end of viridis, white on the dark end.
            shade = (v - low) / (high - low) if high > low else 0.5
            colour = "black" if shade > 0.55 else "white"
            ax.text(j, i, f"{v:.3f}", ha="center", va="center", fontsize=CELL_POINTS, color=colour)
    # The colour bar as tall as the panel's cells, just right of them.
    span = cell * max(len(panel.galleries), 1)
    bar = fig.colorbar(image, cax=ax.inset_axes((1 + 0.12 / span, 0, 0.16 / span, 1)))
    bar.ax.tick_params(labelsize=CELL_POINTS)


def write_heatmap(
    result: CrossModelResult,
    metrics: Sequence[str],
    path: str | Path,
    query_order: Sequence[str] | None = None,
    gallery_order: Sequence[str] | None = None,
    title: str = "",
) -> None:
    """Write ``heatmap_figure`` to ``path`` as PNG, atomically."""
    fig = heatmap_figure(result, metrics, query_order, gallery_order, title)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=HEATMAP_DPI)
