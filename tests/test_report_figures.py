"""The cross-model heatmap as the report shows it: the models' own pairs apart from the pairs
through a head, no panel wider than the report's text column, and every label at a size that
reads unscaled (tests/test_report_browser.py checks the report does show it unscaled)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from modelupgrade.evaluation.cross_model import (
    HEATMAP_DPI,
    HEATMAP_MAX_WIDTH_PX,
    CrossModelResult,
    heatmap_figure,
    write_heatmap,
)

# Smallest text, in pixels at 100 %: a label smaller than this does not read on a screen.
SMALLEST_TEXT_PX = 10.5


def cross_model_result(
    models: list[str], heads: list[str], reverse: list[str], metrics: tuple[str, ...]
) -> CrossModelResult:
    """Every model's queries against every model's and head's gallery, and the reverse heads'
    queries against the old gallery, each pair with a value per metric."""
    rng = np.random.default_rng(0)
    pairs = [(q, g) for q in models for g in models + heads] + [(q, models[0]) for q in reverse]
    rows = [(q, g, metric, float(rng.random())) for q, g in pairs for metric in metrics]
    return CrossModelResult(
        pd.DataFrame(rows, columns=["query_set", "gallery_set", "metric", "value"])
    )


def full_study_sets() -> tuple[list[str], list[str], list[str]]:
    """The embedding sets of a scenario of params/full-cpu.yaml: ten models, eleven forward heads
    and adapters, two reverse ones."""
    strategies = [
        "independent",
        "bct",
        "regression",
        "focal",
        "lce",
        "unibct",
        "ract",
        "dmu",
        "bict",
    ]
    models = ["gen0", *(f"gen1-{s}" for s in strategies)]
    kinds = ["fct", "fastfill", "bict", "dmu", "fct_bct", "affine.all", "procrustes.all"]
    kinds += ["residual_mlp.all", "affine.n300", "procrustes.n300", "residual_mlp.n300"]
    heads = [f"{kind}-independent(gen0)" for kind in kinds]
    reverse = ["rqt-independent(gen1-independent)", "slerp_query.all-independent(gen1-independent)"]
    return models, heads, reverse


def text_sizes_px(fig) -> list[float]:
    """The size, in pixels at the figure's resolution, of every piece of text drawn."""
    fig.draw_without_rendering()
    return [
        text.get_fontsize() * fig.dpi / 72
        for text in fig.findobj(lambda artist: hasattr(artist, "get_fontsize"))
        if text.get_visible() and getattr(text, "get_text", lambda: "")()
    ]


def test_the_models_and_the_heads_have_panels_of_their_own() -> None:
    models, heads, reverse = (
        ["gen0", "gen1-independent", "gen1-bct"],
        ["fct-independent(gen0)"],
        ["rqt-independent(gen1-independent)"],
    )
    fig = heatmap_figure(
        cross_model_result(models, heads, reverse, ("mAP", "top1")), ["mAP", "top1"]
    )
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert list(panels) == [
        f"{metric}: {part}"
        for metric in ("mAP", "top1")
        for part in (
            "models",
            "galleries through a head or adapter",
            "queries through a head or adapter",
        )
    ]

    def labels(title: str) -> tuple[list[str], list[str]]:
        ax = panels[title]
        return [t.get_text() for t in ax.get_yticklabels()], [
            t.get_text() for t in ax.get_xticklabels()
        ]

    # Each pair once: the models' own, the models' queries on a head's gallery, a reverse head's
    # queries on the old gallery.
    assert labels("mAP: models") == (models, models)
    assert labels("mAP: galleries through a head or adapter") == (models, heads)
    assert labels("mAP: queries through a head or adapter") == (reverse, ["gen0"])


def test_a_full_study_heatmap_fits_the_report_column_with_every_label_readable(tmp_path) -> None:
    models, heads, reverse = full_study_sets()
    result = cross_model_result(models, heads, reverse, ("mAP", "top1"))
    fig = heatmap_figure(result, ["mAP", "top1"])
    assert fig.get_figwidth() * HEATMAP_DPI <= HEATMAP_MAX_WIDTH_PX
    assert min(text_sizes_px(fig)) >= SMALLEST_TEXT_PX
    # No panel holds more columns than fit at a cell wide enough for its value ("0.123" at 11 px
    # takes about 35 px): the heads' columns are shared out among panels.
    panels = [ax for ax in fig.axes if ax.get_title()]
    columns = [len(ax.get_xticklabels()) for ax in panels]
    assert len(panels) > 4 and sum(columns) == 2 * (len(models) + 1 + len(heads))
    for ax, count in zip(panels, columns, strict=True):
        assert ax.get_window_extent().width / count >= 0.6 * HEATMAP_DPI
    path = tmp_path / "heatmap.png"
    write_heatmap(result, ["mAP", "top1"], path)
    from PIL import Image

    with Image.open(path) as image:
        assert image.width <= HEATMAP_MAX_WIDTH_PX
