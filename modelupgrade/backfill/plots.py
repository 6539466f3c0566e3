"""The backfill-curve figure of a study: small multiples, one panel per serving mode.

A scenario's study can hold well over a hundred (system, ordering policy, serving mode) curves; on
one pair of axes they cannot be told apart. ``backfill_figure`` draws one panel per serving mode
(in the order of ``SERVING_MODE_ORDER``, then any other mode) with:

- one colour per system, the same in every panel;
- one line style per ordering policy. A panel with few curves (``ALL_POLICIES_UP_TO`` deployable
  ones or fewer) draws every deployable policy of every system; a crowded one draws per system only
  the deployable policy with the best AUC of the plotted metric (the study's ``primary_auc``), the
  curve a team would deploy. The panel's title says which, and names the best curve with its AUC;
- the non-deployable policies (the oracle) as thin grey lines, in a crowded panel only the best
  one: the headroom a better order would have;
- systems whose drawn curve is the same as another system's in that panel (e.g. a head that only
  acts in another mode) drawn once, the others named in the panel;
- M(old, old) and, when the study has it, M(new, new) of the independently trained new model as
  horizontal lines in every panel.

Panels share their axes (backfill fraction t, the metric: mAP, as the report's curves). One
shared legend below the panels names the systems (colours), the reference levels and the policies
(line styles); every curve is still in ``backfill_curves.{parquet,csv}`` and the dvc plots.
``plot_curves`` writes the figure atomically; matplotlib is imported only when a figure is drawn
(importing the library stays fast).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from modelupgrade.backfill.summary import BackfillSummary, auc_mean, auc_trapezoid
from modelupgrade.io import atomic_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SERVING_MODE_ORDER = ("mixed", "rank-merge", "rank-merge-rqt", "rank-merge-full")
POLICY_STYLES = {
    "random": "-",
    "old-confidence": "--",
    "old-entropy": "-.",
    "fastfill-uncertainty": (0, (1, 1.2)),
}
EXTRA_STYLES: Sequence[Any] = ((0, (5, 1.5, 1, 1.5, 1, 1.5)), (0, (8, 2)), (0, (3, 3)))
# A panel draws every deployable policy of its systems when that makes this many lines or fewer,
# otherwise each system's best one.
ALL_POLICIES_UP_TO = 12
OLD_OLD_STYLE = {"color": "0.3", "linestyle": (0, (5, 3)), "linewidth": 1.2}
NEW_NEW_STYLE = {"color": "black", "linestyle": (0, (1, 1.5)), "linewidth": 1.5}
ORACLE_COLOUR = "0.7"
DPI = 150
AUC_NAMES = {"auc_trapezoid": "AUC (trapezoid)", "auc_mean": "AUC (mean of points)"}
SYSTEM_MARKERS = ("", "o", "s", "^", "D", "v")


def _ordered_modes(modes: Sequence[str]) -> list[str]:
    known = [m for m in SERVING_MODE_ORDER if m in modes]
    return known + sorted(m for m in modes if m not in SERVING_MODE_ORDER)


def _policy_styles(policies: Sequence[str]) -> dict[str, Any]:
    styles = {p: s for p, s in POLICY_STYLES.items() if p in policies}
    extra = iter(EXTRA_STYLES)
    for policy in policies:
        if policy not in styles:
            styles[policy] = next(extra, "-")
    return styles


def _system_looks(systems: Sequence[str]) -> dict[str, tuple[Any, str]]:
    """(colour, marker) per system: the nine strong colours of tab10 without its grey (grey is
    the references'), then their light tab20 twins with a marker, then other markers."""
    import matplotlib

    tab20 = matplotlib.colormaps["tab20"]
    strong = [tab20(2 * i) for i in range(10) if i != 7]
    light = [tab20(2 * i + 1) for i in range(10) if i != 7]
    looks = {}
    for i, system in enumerate(systems):
        cycle, k = divmod(i, len(strong))
        colour = strong[k] if cycle % 2 == 0 else light[k]
        looks[system] = (colour, SYSTEM_MARKERS[cycle % len(SYSTEM_MARKERS)])
    return looks


def _auc(part: pd.DataFrame, metric: str, kind: str) -> float:
    values = part[metric].to_numpy(dtype=np.float64)
    if kind == "auc_mean":
        return auc_mean(values)
    return auc_trapezoid(part["t"].to_numpy(dtype=np.float64), values)


Curve = tuple[str, str, pd.DataFrame]  # (system, policy, its points in t order)


def _panel_curves(
    panel: pd.DataFrame, metric: str, primary_auc: str
) -> tuple[list[Curve], list[Curve], bool]:
    """What one serving mode's panel draws: its deployable curves, its non-deployable (oracle)
    curves, and whether it is crowded (then only each system's best deployable curve and the best
    oracle curve are drawn)."""
    deployable: dict[str, list[tuple[float, Curve]]] = {}
    reference: list[tuple[float, Curve]] = []
    for (system, policy), part in panel.groupby(["strategy", "policy"], sort=False):
        part = part.sort_values("t")
        auc = _auc(part, metric, primary_auc)
        entry = (auc if math.isfinite(auc) else -math.inf, (system, policy, part))
        if bool(part["deployable"].iloc[0]):
            deployable.setdefault(system, []).append(entry)
        else:
            reference.append(entry)
    crowded = sum(len(options) for options in deployable.values()) > ALL_POLICIES_UP_TO
    drawn = [
        curve
        for options in deployable.values()
        for _, curve in ([max(options, key=lambda o: o[0])] if crowded else options)
    ]
    if crowded and reference:
        reference = [max(reference, key=lambda o: o[0])]
    return drawn, [curve for _, curve in reference], crowded


def _same_curve(a: pd.DataFrame, b: pd.DataFrame, metric: str) -> bool:
    return len(a) == len(b) and bool(
        np.allclose(a["t"].to_numpy(), b["t"].to_numpy())
        and np.allclose(a[metric].to_numpy(), b[metric].to_numpy(), rtol=0, atol=1e-9)
    )


def _folded(systems: dict[str, list[str]], crowded: bool) -> list[str]:
    """The systems folded into another's curve, with their orders where the panel draws several."""
    return [s if crowded else f"{s} ({', '.join(policies)})" for s, policies in systems.items()]


def _reference_levels(summary: BackfillSummary, metric: str) -> list[tuple[str, float, Any]]:
    """(label, value, line style) of the horizontal reference lines."""
    levels = []
    old_old = summary.old_old.get(metric)
    if old_old is not None:
        levels.append((f"M(old, old) = {old_old:.3f}", old_old, OLD_OLD_STYLE))
    new_new = (summary.reference_new_new or {}).get(metric)
    if new_new is not None:
        system = summary.reference_system or "independent"
        levels.append((f"M(new, new), {system} = {new_new:.3f}", new_new, NEW_NEW_STYLE))
    return levels


def _legend_handles(systems: list[Any], others: list[Any], rows: int) -> list[Any]:
    """Systems first, then the orders and references in columns of their own: a legend fills its
    columns top to bottom, so both groups are padded to whole columns of ``rows`` entries."""
    from matplotlib.lines import Line2D

    def padded(handles: list[Any]) -> list[Any]:
        blank = Line2D([], [], linestyle="none", label=" ")
        return handles + [blank] * (-len(handles) % rows)

    return padded(systems) + padded(others)


def backfill_figure(tidy: pd.DataFrame, summary: BackfillSummary, metric: str = "mAP") -> Figure:
    """The figure of a study's curves (``backfill_curves.parquet``) and its summary: one panel per
    serving mode present, one shared legend below the panels."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    if metric not in tidy.columns:
        raise ValueError(f"the curves have no {metric!r} column")
    if tidy.empty:
        raise ValueError("there are no curves to plot")
    modes = _ordered_modes(list(dict.fromkeys(tidy["mode"])))
    looks = _system_looks(list(dict.fromkeys(tidy["strategy"])))
    styles = _policy_styles(list(dict.fromkeys(tidy["policy"])))
    levels = _reference_levels(summary, metric)

    columns = 1 if len(modes) == 1 else 2
    rows = math.ceil(len(modes) / columns)
    width = 6.4 * columns if columns > 1 else 8.0
    fig = Figure(figsize=(width, 4.0 * rows + 2.2), dpi=DPI, layout="constrained")
    grid = fig.subplots(rows, columns, sharex=True, sharey=True, squeeze=False)
    axes = list(grid.flat)
    for ax in axes[len(modes) :]:
        ax.remove()
    used_systems: dict[str, None] = {}
    used_policies: dict[str, None] = {}
    oracle_policies: dict[str, None] = {}
    for ax, mode in zip(axes, modes, strict=False):
        drawn, oracle, crowded = _panel_curves(
            tidy[tidy["mode"] == mode], metric, summary.primary_auc
        )
        for _, policy, part in oracle:
            ax.plot(part["t"], part[metric], color=ORACLE_COLOUR, linewidth=1.0, zorder=1)
            oracle_policies[policy] = None
        shown: list[Curve] = []
        same_as: dict[str, dict[str, list[str]]] = {}  # shown system → folded system → orders
        for system, policy, part in drawn:
            twin = next(
                (s for s, p, q in shown if p == policy and _same_curve(q, part, metric)), None
            )
            if twin is not None:
                same_as.setdefault(twin, {}).setdefault(system, []).append(policy)
                continue
            shown.append((system, policy, part))
            colour, marker = looks[system]
            ax.plot(
                part["t"],
                part[metric],
                color=colour,
                linestyle=styles[policy],
                marker=marker or None,
                markersize=3.5,
                linewidth=1.7,
                zorder=3,
            )
            used_systems[system] = None
            used_policies[policy] = None
        for _, value, style in levels:
            ax.axhline(value, zorder=2, **style)
        if same_as:
            ax.text(
                0.99,
                0.02,
                "\n".join(
                    f"{', '.join(_folded(others, crowded))}: same as {s}"
                    for s, others in same_as.items()
                ),
                transform=ax.transAxes,
                ha="right",
                va="bottom",
                fontsize=7.5,
                color="0.25",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.5},
                zorder=4,
            )
        which = "best deployable order per system" if crowded else "every deployable order"
        best = max(
            (
                (_auc(part, metric, summary.primary_auc), system, policy)
                for system, policy, part in drawn
            ),
            key=lambda c: c[0] if math.isfinite(c[0]) else -math.inf,
            default=None,
        )
        title = f"serving mode: {mode}  ({which})"
        if best is not None and math.isfinite(best[0]):
            title += f"\nhighest {AUC_NAMES.get(summary.primary_auc, summary.primary_auc)}: "
            title += f"{best[1]} · {best[2]} = {best[0]:.3f}"
        ax.set_title(title, fontsize=10)
        ax.set_xlim(0, 1)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=9, labelbottom=True, labelleft=True)
        ax.set_xlabel("backfill fraction t", fontsize=9.5)
        ax.set_ylabel(metric, fontsize=9.5)

    system_handles = [
        Line2D(
            [],
            [],
            color=looks[s][0],
            marker=looks[s][1] or None,
            markersize=4,
            linewidth=2.5,
            label=s,
        )
        for s in used_systems
    ]
    other_handles: list[Any] = [Line2D([], [], label=label, **style) for label, _, style in levels]
    other_handles += [
        Line2D([], [], color="0.2", linestyle=styles[p], linewidth=1.7, label=f"order: {p}")
        for p in used_policies
    ]
    if oracle_policies:
        label = f"order: {', '.join(oracle_policies)} (not deployable)"
        other_handles.append(Line2D([], [], color=ORACLE_COLOUR, linewidth=1.0, label=label))
    legend_rows = max(
        math.ceil(len(system_handles) / 4),
        len(other_handles) if len(other_handles) <= 8 else math.ceil(len(other_handles) / 2),
        1,
    )
    handles = _legend_handles(system_handles, other_handles, legend_rows)
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=math.ceil(len(handles) / legend_rows),
        fontsize=8.5,
        frameon=False,
        handlelength=3.2,
    )
    fig.suptitle(f"{summary.scenario}: {metric} while the gallery is backfilled", fontsize=12.5)
    return fig


def plot_curves(
    tidy: pd.DataFrame, summary: BackfillSummary, path: str | Path, metric: str = "mAP"
) -> None:
    """Write ``backfill_figure`` to ``path`` as PNG, atomically."""
    fig = backfill_figure(tidy, summary, metric)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
