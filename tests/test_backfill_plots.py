"""The backfill-curve figure: panels per serving mode of at most eight systems each, reference
levels in each, the legends outside the panels, a crowded panel reduced to each system's best
deployable curve, and a width the report shows unscaled."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from modelupgrade.backfill.plots import (
    ALL_POLICIES_UP_TO,
    DPI,
    MAX_SYSTEMS,
    backfill_figure,
    plot_curves,
)
from modelupgrade.backfill.summary import BackfillSummary, GridRecord
from tests.processes import run_ok

T = np.linspace(0.0, 1.0, 5)
OLD_OLD, NEW_NEW = 0.40, 0.70


def _curves(combos: list[tuple[str, str, str, bool, float]]) -> pd.DataFrame:
    """(system, policy, mode, deployable, start) → a tidy table of rising curves."""
    rows = [
        {
            "strategy": system,
            "policy": policy,
            "mode": mode,
            "deployable": deployable,
            "t": t,
            "mAP": start + (NEW_NEW - start) * t,
            "top1": 0.5,
        }
        for system, policy, mode, deployable, start in combos
        for t in T
    ]
    return pd.DataFrame(rows)


def _summary(new_new: float | None = NEW_NEW) -> BackfillSummary:
    return BackfillSummary(
        scenario="sc",
        protocol="query-gallery",
        distance="cosine",
        grid=GridRecord(kind="uniform", t=T.tolist(), cutoffs=list(range(len(T)))),
        gallery_size=10,
        queries=5,
        old_old={"mAP": OLD_OLD, "top1": 0.5},
        reference_system=None if new_new is None else "independent",
        reference_new_new=None if new_new is None else {"mAP": new_new, "top1": 0.6},
        primary_auc="auc_trapezoid",
        curves=[],
        skipped=[],
        policies_known=["random", "oracle"],
        serving_modes_known=["mixed", "rank-merge", "rank-merge-rqt"],
    )


def _levels(ax) -> set[float]:
    """The y of every horizontal line across the whole panel (the reference levels)."""
    return {
        round(float(line.get_ydata()[0]), 6)
        for line in ax.lines
        if len(set(np.ravel(line.get_ydata()))) == 1 and list(line.get_xdata()) == [0, 1]
    }


def test_one_panel_per_serving_mode_with_references_and_the_legend_outside():
    tidy = _curves(
        [
            ("independent", "random", "rank-merge", True, 0.40),
            ("bct", "random", "rank-merge", True, 0.41),
            ("independent", "random", "mixed", True, 0.10),
            ("independent", "oracle", "mixed", False, 0.15),
            ("bct", "random", "mixed", True, 0.45),
            ("bct", "oracle", "mixed", False, 0.50),
            ("rqt-independent", "random", "rank-merge-rqt", True, 0.48),
        ]
    )
    fig = backfill_figure(tidy, _summary())
    # The serving modes present, in the study's order, one panel each.
    assert len(fig.axes) == 3
    titles = [ax.get_title() for ax in fig.axes]
    for title, mode in zip(titles, ["mixed", "rank-merge", "rank-merge-rqt"], strict=True):
        assert title.startswith(f"serving mode: {mode} ")
    for ax in fig.axes:
        assert _levels(ax) == {OLD_OLD, NEW_NEW}
        assert ax.get_xlabel() == "backfill fraction t"
        assert ax.get_ylabel() == "mAP"
    # Each panel names its systems beside it; the figure's legend the references and the orders.
    systems = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes]
    assert systems == [["bct", "independent"], ["bct", "independent"], ["rqt-independent"]]
    # Three systems, fewer than the colours: each has its colour in every panel.
    colours = [
        {
            t.get_text(): h.get_color()
            for t, h in zip(
                ax.get_legend().get_texts(), ax.get_legend().legend_handles, strict=True
            )
        }
        for ax in fig.axes
    ]
    assert colours[0] == colours[1] and len({*colours[0].values(), *colours[2].values()}) == 3
    (legend,) = fig.legends
    labels = {text.get_text() for text in legend.get_texts()}
    assert "order: random" in labels and not labels & {"independent", "bct"}
    assert "M(old, old) = 0.400" in labels
    assert "M(new, new), independent = 0.700" in labels
    assert "order: oracle (not deployable)" in labels

    fig.draw_without_rendering()
    box = legend.get_window_extent()
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent())
        assert box.y1 < ax.get_window_extent().y0  # below the panels
        beside = ax.get_legend().get_window_extent()
        assert beside.x0 > ax.get_window_extent().x1  # right of its panel


def test_without_a_reference_model_only_old_old_is_drawn():
    tidy = _curves([("bct", "random", "mixed", True, 0.45)])
    fig = backfill_figure(tidy, _summary(new_new=None))
    (ax,) = fig.axes
    assert _levels(ax) == {OLD_OLD}
    assert not any(t.get_text().startswith("M(new, new)") for t in fig.legends[0].get_texts())


def test_a_crowded_panel_draws_each_systems_best_deployable_curve_and_folds_equal_ones():
    systems = [f"s{i}" for i in range(ALL_POLICIES_UP_TO)]
    combos = [(s, "random", "mixed", True, 0.2 + 0.01 * i) for i, s in enumerate(systems)]
    combos += [(s, "old-confidence", "mixed", True, 0.1) for s in systems]
    combos += [("twin", "random", "mixed", True, 0.2)]  # the same curve as s0's
    combos += [(s, "oracle", "mixed", False, 0.3 + 0.01 * i) for i, s in enumerate(systems)]
    fig = backfill_figure(_curves(combos), _summary())
    # 13 systems, ranked by AUC: s11 … s4 in the first panel, s3 … s0 and the twin in the second.
    first, second = fig.axes
    assert "best deployable order per system" in first.get_title()
    assert "systems 1–8 of 13, ranked by AUC" in first.get_title()
    assert "s11 · random" in first.get_title()  # the highest AUC
    assert "systems 9–13 of 13" in second.get_title()
    for ax, drawn in ((first, 8), (second, 4)):
        curves = [line for line in ax.lines if len(line.get_xdata()) == len(T)]
        # One curve per system (the twin folded into s0's) and the best oracle curve.
        assert len(curves) == drawn + 1
    assert [t.get_text() for t in first.texts] == []
    assert [t.get_text() for t in second.texts] == ["twin: same as s0"]


def test_a_panel_with_few_curves_draws_every_deployable_order():
    # twin's curves are bct's, order for order.
    combos = [
        (system, policy, "mixed", True, start)
        for system in ("bct", "twin")
        for policy, start in (("random", 0.45), ("old-confidence", 0.35))
    ]
    (ax,) = backfill_figure(_curves(combos), _summary()).axes
    assert "every deployable order" in ax.get_title()
    assert "bct · random" in ax.get_title()
    assert len([line for line in ax.lines if len(line.get_xdata()) == len(T)]) == 2
    assert [text.get_text() for text in ax.texts] == ["twin (random, old-confidence): same as bct"]


def test_no_panel_holds_more_than_eight_systems_each_in_its_own_colour():
    systems = [f"s{i:02d}" for i in range(19)]
    combos = [c for mode in ("mixed", "rank-merge") for c in _curves_of(systems, mode)]
    fig = backfill_figure(_curves(combos), _summary())
    # Per serving mode 19 systems: three panels of 8, 8 and 3, ranked by AUC.
    assert len(fig.axes) == 6
    for ax, count in zip(fig.axes, [8, 8, 3] * 2, strict=True):
        lines = [line for line in ax.lines if len(line.get_xdata()) == len(T)]
        assert len(lines) == count <= MAX_SYSTEMS
        assert len({line.get_color() for line in lines}) == count
        assert [t.get_text() for t in ax.get_legend().get_texts()][:1] == [
            systems[-1 - 8 * (fig.axes.index(ax) % 3)]
        ]
    # As wide as the report's text column, so that it is shown unscaled.
    assert fig.get_figwidth() * DPI <= 1100


def _curves_of(systems: list[str], mode: str) -> list[tuple[str, str, str, bool, float]]:
    return [(s, "random", mode, True, 0.1 + 0.02 * i) for i, s in enumerate(systems)]


def test_plot_curves_writes_a_png(tmp_path):
    tidy = _curves([("bct", "random", "mixed", True, 0.45)])
    path = tmp_path / "plots" / "backfill_curves.png"
    plot_curves(tidy, _summary(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["backfill_curves.png"]


def test_an_unknown_metric_is_refused():
    with pytest.raises(ValueError, match="mAP@10"):
        backfill_figure(_curves([("bct", "random", "mixed", True, 0.45)]), _summary(), "mAP@10")


def test_importing_the_module_does_not_import_matplotlib():
    code = "import sys, modelupgrade.backfill.plots; assert 'matplotlib' not in sys.modules"
    run_ok([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1])
