"""The backfill curves the papers' claims compare, drawn over the training seeds.

A claim on backfilling (FastFill's σ² order against a random one, Seo et al.'s full rank merge
against the naive one, the naive rank merge's monotonicity) compares curves; its checks name them
(``Check.curves``). Per scenario, one panel per claim and metric draws each of those curves as its
mean over the seeds that simulated it (the study's own and the replicates') with a band of ± one
sample standard deviation, beside M(old, old): what the verdict weighs, as a picture.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from modelupgrade.backfill.plots import OLD_OLD_STYLE, SYSTEM_COLOURS
from modelupgrade.io import atomic_path
from modelupgrade.report.claims import Claim, CurveRef
from modelupgrade.report.results import StudyResults

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Drawn to be read at 100 % in the report's text column: 1,100 px at this resolution.
DPI = 100
WIDTH_INCHES = 11.0
PANEL_INCHES = 4.0
TEXT_POINTS = 9.0
# At most this many curves share a panel (each in a colour of its own there: the backfill
# figures' colours).
MAX_CURVES = len(SYSTEM_COLOURS)
BAND_ALPHA = 0.2


@dataclass(frozen=True)
class ClaimPanel:
    """One claim's curves in one scenario and metric."""

    claim: int  # the claim's number in the report
    statement: str
    scenario: str
    metric: str
    curves: tuple[CurveRef, ...]


@dataclass(frozen=True)
class SeedCurve:
    """One curve over the seeds that simulated it: t, the mean and the sample sd at each point
    (NaN with one seed), and how many seeds."""

    t: np.ndarray
    mean: np.ndarray
    sd: np.ndarray
    seeds: int


def claim_panels(claims: Sequence[Claim]) -> list[ClaimPanel]:
    """The panels of the claims that compare curves: per claim, scenario and metric the curves its
    checks in scope compare, at most ``MAX_CURVES`` a panel."""
    panels = []
    for number, claim in enumerate(claims, 1):
        grouped: dict[tuple[str, str], dict[CurveRef, None]] = {}
        for check in claim.checks:
            for ref in check.draws[0].curves:
                grouped.setdefault((ref.scenario, ref.metric), {})[ref] = None
        for (scenario, metric), refs in grouped.items():
            curves = list(refs)
            for i in range(0, len(curves), MAX_CURVES):
                panels.append(
                    ClaimPanel(
                        number,
                        claim.statement,
                        scenario,
                        metric,
                        tuple(curves[i : i + MAX_CURVES]),
                    )
                )
    return panels


def seed_curve(seeds: Sequence[StudyResults], ref: CurveRef) -> SeedCurve | None:
    """``ref``'s curve over the seeds whose scenario simulated it on the same points."""
    runs = []
    for study in seeds:
        for sc in study.scenarios:
            if sc.name == ref.scenario:
                points = sc.curve_points(ref.system, ref.policy, ref.mode)
                if points is not None and ref.metric in points:
                    runs.append(points)
    if not runs:
        return None
    t = runs[0]["t"].to_numpy(dtype=np.float64)
    same = [r for r in runs if np.allclose(r["t"].to_numpy(dtype=np.float64), t)]
    values = np.stack([r[ref.metric].to_numpy(dtype=np.float64) for r in same])
    sd = values.std(axis=0, ddof=1) if len(same) > 1 else np.full(len(t), math.nan)
    return SeedCurve(t, values.mean(axis=0), sd, len(same))


def _old_old(seeds: Sequence[StudyResults], scenario: str, metric: str) -> float | None:
    """M(old, old) in ``metric``, the mean over the seeds' backfill studies of ``scenario``."""
    values = [
        sc.backfill.old_old[metric]
        for study in seeds
        for sc in study.scenarios
        if sc.name == scenario and sc.backfill is not None and metric in sc.backfill.old_old
    ]
    return float(np.mean(values)) if values else None


def _label(ref: CurveRef, panel: ClaimPanel, curve: SeedCurve) -> str:
    modes = {r.mode for r in panel.curves}
    name = f"{ref.system} · {ref.policy}" + ("" if len(modes) == 1 else f" · {ref.mode}")
    return f"{name} ({curve.seeds} seed{'s' if curve.seeds != 1 else ''})"


def claim_curves_figure(
    panels: Sequence[ClaimPanel], seeds: Sequence[StudyResults], scenario: str
) -> Figure | None:
    """One scenario's claim panels, two a row (a claim's metrics side by side); None where none of
    their curves was found."""
    from matplotlib.figure import Figure

    drawn: list[tuple[ClaimPanel, list[tuple[CurveRef, SeedCurve]]]] = []
    for panel in panels:
        if panel.scenario != scenario:
            continue
        found = [(ref, seed_curve(seeds, ref)) for ref in panel.curves]
        curves = [(ref, curve) for ref, curve in found if curve is not None]
        if curves:
            drawn.append((panel, curves))
    if not drawn:
        return None
    columns = 2 if len(drawn) > 1 else 1
    rows = math.ceil(len(drawn) / columns)
    fig = Figure(figsize=(WIDTH_INCHES, PANEL_INCHES * rows + 0.6), dpi=DPI)
    fig.set_layout_engine("constrained")
    axes = list(fig.subplots(rows, columns, squeeze=False).flat)
    for ax in axes[len(drawn) :]:
        ax.remove()
    for ax, (panel, curves) in zip(axes, drawn, strict=False):
        _draw(ax, panel, curves, _old_old(seeds, scenario, panel.metric))
    fig.suptitle(
        f"{scenario}: the curves the claims compare, mean ± sd over the training seeds",
        fontsize=TEXT_POINTS + 2,
    )
    return fig


def _draw(
    ax: Any, panel: ClaimPanel, curves: list[tuple[CurveRef, SeedCurve]], old_old: float | None
) -> None:
    for (ref, curve), colour in zip(curves, SYSTEM_COLOURS, strict=False):
        ax.plot(curve.t, curve.mean, color=colour, linewidth=1.8, label=_label(ref, panel, curve))
        if curve.seeds > 1:
            ax.fill_between(
                curve.t,
                curve.mean - curve.sd,
                curve.mean + curve.sd,
                color=colour,
                alpha=BAND_ALPHA,
                linewidth=0,
            )
    if old_old is not None:
        ax.axhline(old_old, label=f"M(old, old) = {old_old:.3f}", **OLD_OLD_STYLE)
    title = textwrap.shorten(panel.statement, 80, placeholder=" …")
    ax.set_title(
        textwrap.fill(f"claim {panel.claim}: {title}", 62) + f"\n{panel.metric}",
        fontsize=TEXT_POINTS,
    )
    ax.set_xlim(0, 1)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=TEXT_POINTS)
    ax.set_xlabel("backfill fraction t", fontsize=TEXT_POINTS)
    ax.set_ylabel(panel.metric, fontsize=TEXT_POINTS)
    # Below the panel: a legend inside would hide the curves it names.
    ax.legend(
        fontsize=TEXT_POINTS,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.2),
        frameon=False,
    )


def write_claim_curves(
    claims: Sequence[Claim], seeds: Sequence[StudyResults], plots_dir: Path
) -> dict[str, Path]:
    """Each scenario's figure of its claims' curves as ``<plots_dir>/<scenario>_claim_curves.png``
    (written atomically); the paths by scenario, only where there was a curve to draw."""
    panels = claim_panels(claims)
    written = {}
    for scenario in dict.fromkeys(panel.scenario for panel in panels):
        fig = claim_curves_figure(panels, seeds, scenario)
        if fig is None:
            continue
        path = plots_dir / f"{scenario}_claim_curves.png"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI)
        written[scenario] = path
    return written
