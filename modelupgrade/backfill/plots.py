"""The backfill-curve figure of a study: small multiples, panels per serving mode.

A scenario's study can hold well over a hundred (system, ordering policy, serving mode) curves; on
one pair of axes they cannot be told apart. ``backfill_figure`` draws per serving mode (in the order
of ``SERVING_MODE_ORDER``, then any other mode) one panel per ``MAX_SYSTEMS`` systems, the systems
ranked by their best AUC, with:

- one of ``MAX_SYSTEMS`` distinct colours per system of the panel, named in the panel's legend
  (the same colour in every panel where the figure has no more systems than colours);
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

Panels are stacked and share their axes (backfill fraction t, the metric: mAP, as the report's
curves); the figure is as wide as the report's text column, to be read unscaled. One shared legend
below the panels names the reference levels and the policies (line styles); every curve is still
in ``backfill_curves.{parquet,csv}`` and the dvc plots.
``plot_curves`` writes the figure atomically; matplotlib is imported only when a figure is drawn
(importing the library stays fast).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd

from modelupgrade.backfill.summary import BackfillSummary, auc_mean, auc_trapezoid
from modelupgrade.io import atomic_path

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.typing import LineStyleType as LineStyle

SERVING_MODE_ORDER = ("mixed", "rank-merge", "rank-merge-rqt", "rank-merge-full")
POLICY_STYLES: dict[str, LineStyle] = {
    "random": "-",
    "old-confidence": "--",
    "old-entropy": "-.",
    "fastfill-uncertainty": (0, (1, 1.2)),
}
EXTRA_STYLES: Sequence[LineStyle] = ((0, (5, 1.5, 1, 1.5, 1, 1.5)), (0, (8, 2)), (0, (3, 3)))
# A panel draws every deployable policy of its systems when that makes this many lines or fewer,
# otherwise each system's best one.
ALL_POLICIES_UP_TO = 12
# At most this many systems share a panel (each in a colour of its own there); a serving mode with
# more has several panels, its systems ranked by their best AUC.
MAX_SYSTEMS = 8
# Eight colours that tell apart at a glance (tab10 without its grey, the references', and olive).
SYSTEM_COLOURS = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:cyan",
)
OLD_OLD_STYLE = {"color": "0.3", "linestyle": (0, (5, 3)), "linewidth": 1.2}
NEW_NEW_STYLE = {"color": "black", "linestyle": (0, (1, 1.5)), "linewidth": 1.5}
ORACLE_COLOUR = "0.7"
# Drawn to be read at 100 % in the report's text column (1,100 px at this resolution; a point of
# text is 100/72 px).
DPI = 100
WIDTH_INCHES = 11.0
PANEL_INCHES = 3.6
TEXT_POINTS = 9.0
AUC_NAMES = {"auc_trapezoid": "AUC (trapezoid)", "auc_mean": "AUC (mean of points)"}


def _ordered_modes(modes: Sequence[str]) -> list[str]:
    known = [m for m in SERVING_MODE_ORDER if m in modes]
    return known + sorted(m for m in modes if m not in SERVING_MODE_ORDER)


def _policy_styles(policies: Sequence[str]) -> dict[str, LineStyle]:
    styles = {p: s for p, s in POLICY_STYLES.items() if p in policies}
    extra = iter(EXTRA_STYLES)
    for policy in policies:
        if policy not in styles:
            styles[policy] = next(extra, "-")
    return styles


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


class Panel(NamedTuple):
    """One panel: a serving mode's curves of at most ``MAX_SYSTEMS`` systems (the ``part``-th of
    ``parts`` groups of its systems, ranked by their best AUC), with the mode's oracle curves."""

    mode: str
    drawn: list[Curve]
    oracle: list[Curve]
    crowded: bool
    part: int
    parts: int
    systems: int  # how many systems the mode has in all


def _panels(tidy: pd.DataFrame, metric: str, primary_auc: str) -> list[Panel]:
    """Each serving mode's panels: its systems ranked by their best AUC, ``MAX_SYSTEMS`` a panel."""
    panels = []
    for mode in _ordered_modes(list(dict.fromkeys(tidy["mode"]))):
        drawn, oracle, crowded = _panel_curves(tidy[tidy["mode"] == mode], metric, primary_auc)
        best: dict[str, float] = {}
        for system, _, part in drawn:
            auc = _auc(part, metric, primary_auc)
            auc = auc if math.isfinite(auc) else -math.inf
            best[system] = max(best.get(system, -math.inf), auc)
        ranked = sorted(best, key=lambda s: -best[s])
        groups = [ranked[i : i + MAX_SYSTEMS] for i in range(0, len(ranked), MAX_SYSTEMS)] or [[]]
        for k, group in enumerate(groups):
            curves = [c for c in drawn if c[0] in group]
            curves.sort(key=lambda c: group.index(c[0]))
            panels.append(Panel(mode, curves, oracle, crowded, k, len(groups), len(ranked)))
    return panels


def _title(panel: Panel, metric: str, primary_auc: str) -> str:
    which = "best deployable order per system" if panel.crowded else "every deployable order"
    title = f"serving mode: {panel.mode}  ({which})"
    if panel.parts > 1:
        first = panel.part * MAX_SYSTEMS + 1
        last = min(first + MAX_SYSTEMS - 1, panel.systems)
        title += f"\nsystems {first}–{last} of {panel.systems}, ranked by AUC"
    best = max(
        ((_auc(part, metric, primary_auc), system, policy) for system, policy, part in panel.drawn),
        key=lambda c: c[0] if math.isfinite(c[0]) else -math.inf,
        default=None,
    )
    if best is not None and math.isfinite(best[0]):
        title += f"\nhighest {AUC_NAMES.get(primary_auc, primary_auc)}: "
        title += f"{best[1]} · {best[2]} = {best[0]:.3f}"
    return title


def _shared_colours(panels: Sequence[Panel]) -> dict[str, str]:
    """One colour per system for the whole figure where it has no more systems than colours (a
    system then looks the same in every panel); none otherwise (each panel colours its own)."""
    systems = list(dict.fromkeys(system for panel in panels for system, _, _ in panel.drawn))
    if len(systems) > len(SYSTEM_COLOURS):
        return {}
    return dict(zip(systems, SYSTEM_COLOURS, strict=False))


def backfill_figure(tidy: pd.DataFrame, summary: BackfillSummary, metric: str = "mAP") -> Figure:
    """The figure of a study's curves (``backfill_curves.parquet``) and its summary: per serving
    mode present one panel per ``MAX_SYSTEMS`` systems, stacked, each with its systems' legend
    beside it; one shared legend below the panels for the reference levels and the orders."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    if metric not in tidy.columns:
        raise ValueError(f"the curves have no {metric!r} column")
    if tidy.empty:
        raise ValueError("there are no curves to plot")
    styles = _policy_styles(list(dict.fromkeys(tidy["policy"])))
    levels = _reference_levels(summary, metric)
    panels = _panels(tidy, metric, summary.primary_auc)
    everywhere = _shared_colours(panels)

    fig = Figure(figsize=(WIDTH_INCHES, PANEL_INCHES * len(panels) + 1.4), dpi=DPI)
    fig.set_layout_engine("constrained")
    axes = list(fig.subplots(len(panels), 1, sharex=True, sharey=True, squeeze=False)[:, 0])
    used_policies: dict[str, None] = {}
    oracle_policies: dict[str, None] = {}
    for ax, panel in zip(axes, panels, strict=True):
        for _, policy, part in panel.oracle:
            ax.plot(part["t"], part[metric], color=ORACLE_COLOUR, linewidth=1.0, zorder=1)
            oracle_policies[policy] = None
        colours, same_as = _draw_systems(ax, panel, metric, styles, everywhere, used_policies)
        for _, value, style in levels:
            ax.axhline(value, zorder=2, **style)
        if same_as:
            _note_folded(ax, panel, same_as)
        _decorate_panel(ax, panel, metric, summary, colours)

    other_handles: list[Any] = [Line2D([], [], label=label, **style) for label, _, style in levels]
    other_handles += [
        Line2D([], [], color="0.2", linestyle=styles[p], linewidth=1.7, label=f"order: {p}")
        for p in used_policies
    ]
    if oracle_policies:
        label = f"order: {', '.join(oracle_policies)} (not deployable)"
        other_handles.append(Line2D([], [], color=ORACLE_COLOUR, linewidth=1.0, label=label))
    fig.legend(
        handles=other_handles,
        loc="outside lower center",
        ncol=min(3, max(len(other_handles), 1)),
        fontsize=TEXT_POINTS,
        frameon=False,
        handlelength=3.2,
    )
    fig.suptitle(f"{summary.scenario}: {metric} while the gallery is backfilled", fontsize=12)
    return fig


def _draw_systems(
    ax: Axes,
    panel: Panel,
    metric: str,
    styles: dict[str, LineStyle],
    everywhere: dict[str, str],
    used_policies: dict[str, None],
) -> tuple[dict[str, str], dict[str, dict[str, list[str]]]]:
    """Draw the panel's system curves, a curve identical to one drawn already under the same
    order folded into it; returns each drawn system's colour and, per drawn system, the systems
    folded into it with their orders. Adds the orders drawn to ``used_policies``."""
    shown: list[Curve] = []
    colours: dict[str, str] = {}
    palette = iter(SYSTEM_COLOURS)
    same_as: dict[str, dict[str, list[str]]] = {}  # shown system → folded system → orders
    for system, policy, part in panel.drawn:
        twin = next((s for s, p, q in shown if p == policy and _same_curve(q, part, metric)), None)
        if twin is not None and twin != system:
            same_as.setdefault(twin, {}).setdefault(system, []).append(policy)
            continue
        shown.append((system, policy, part))
        if system not in colours:
            colours[system] = everywhere.get(system) or next(palette)
        colour = colours[system]
        ax.plot(
            part["t"],
            part[metric],
            color=colour,
            linestyle=styles[policy],
            linewidth=1.8,
            zorder=3,
        )
        used_policies[policy] = None
    return colours, same_as


def _note_folded(ax: Axes, panel: Panel, same_as: dict[str, dict[str, list[str]]]) -> None:
    """The panel's note of the systems whose curves are those of another."""
    ax.text(
        0.99,
        0.02,
        "\n".join(
            f"{', '.join(_folded(others, panel.crowded))}: same as {s}"
            for s, others in same_as.items()
        ),
        transform=ax.transAxes,
        ha="right",
        va="bottom",
        fontsize=TEXT_POINTS,
        color="0.25",
        bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.5},
        zorder=4,
    )


def _decorate_panel(
    ax: Axes, panel: Panel, metric: str, summary: BackfillSummary, colours: dict[str, str]
) -> None:
    """The panel's title, axes, grid and its systems' legend beside it."""
    from matplotlib.lines import Line2D

    ax.set_title(_title(panel, metric, summary.primary_auc), fontsize=TEXT_POINTS + 1)
    ax.set_xlim(0, 1)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=TEXT_POINTS, labelbottom=True, labelleft=True)
    ax.set_xlabel("backfill fraction t", fontsize=TEXT_POINTS)
    ax.set_ylabel(metric, fontsize=TEXT_POINTS)
    handles = [Line2D([], [], color=c, linewidth=2.5, label=s) for s, c in colours.items()]
    if handles:
        ax.legend(
            handles=handles,
            title="system",
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=TEXT_POINTS,
            title_fontsize=TEXT_POINTS,
            frameon=False,
        )


def plot_curves(
    tidy: pd.DataFrame, summary: BackfillSummary, path: str | Path, metric: str = "mAP"
) -> None:
    """Write ``backfill_figure`` to ``path`` as PNG, atomically."""
    fig = backfill_figure(tidy, summary, metric)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
