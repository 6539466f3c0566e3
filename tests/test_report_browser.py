"""The HTML report as a reader sees it, in headless Chromium: it opens on what to use per scenario,
no table cell runs to more than a few lines, and every figure is shown unscaled in a 1400-px
window."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest

from modelupgrade.layout import StudyLayout
from modelupgrade.report import collect_results, write_report
from tests.test_mlflow_ui import CHROMIUM, _chromium_run, _visible_text
from tests.test_report import study_params, write_seeds, write_study

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium executable found: install Debian's chromium (apt-get install -y chromium)",
)
# "A few lines" of a table cell at the report's width.
LONGEST_CELL = 300


def test_html_report_opens_on_the_lead_and_keeps_cells_short(tmp_path: Path) -> None:
    write_study(tmp_path)
    study = collect_results(
        study_params(),
        StudyLayout(metrics_root=tmp_path / "metrics", plots_root=tmp_path / "plots"),
    )
    write_report(study, {"git commit": "abc"}, {"evaluate@sc": 4.25}, tmp_path / "out")
    url = (tmp_path / "out" / "report.html").as_uri()
    dom = _chromium_run(tmp_path, url, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.findall(r"<h2\b.*?</h2>", dom.stdout, re.DOTALL)
    headings = [_visible_text(h).strip() for h in found]
    assert headings[0] == "What to use, per scenario", headings
    cells = [
        unescape(_visible_text(c)).strip()
        for c in re.findall(r"<t[dh]\b.*?</t[dh]>", dom.stdout, re.DOTALL)
    ]
    assert cells and max(map(len, cells)) <= LONGEST_CELL, max(cells, key=len)
    shot = tmp_path / "report.png"
    taken = _chromium_run(tmp_path, url, f"--screenshot={shot}")
    assert taken.returncode == 0 and shot.stat().st_size > 10_000, taken.stderr[-2000:]


# A reader's browser window, and the smallest text a table may show in it.
WINDOW_PX = 1400
SMALLEST_TABLE_TEXT_PX = 12.0
# Appended to a copy of the report: once the page has loaded, each image's natural width and the
# width it is shown at, and the tables' font size, as JSON in a <pre id="probe">.
PROBE = """<script>
window.addEventListener("load", () => {
  const images = [...document.images].map((image) => ({
    src: image.getAttribute("src"),
    natural: image.naturalWidth,
    shown: image.getBoundingClientRect().width,
  }));
  const cell = document.querySelector("td");
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({
    images: images,
    table_font_px: parseFloat(getComputedStyle(cell).fontSize),
  });
  document.body.appendChild(probe);
});
</script>"""


def write_real_figures(root: Path) -> None:
    """The study's figures as the stages draw them, in place of the fixture's placeholders: the
    heatmap of a scenario of params/full-cpu.yaml's size, the chain's, the backfill curves."""
    import pandas as pd

    from modelupgrade.backfill.plots import plot_curves
    from modelupgrade.backfill.summary import BackfillSummary
    from modelupgrade.evaluation.cross_model import write_heatmap
    from tests.test_report_figures import cross_model_result, full_study_sets

    metrics = ("mAP", "top1")
    models, heads, reverse = full_study_sets()
    write_heatmap(
        cross_model_result(models, heads, reverse, metrics),
        metrics,
        root / "plots" / "sc" / "cross_model_heatmap.png",
        title="sc: M(query, gallery)",
    )
    write_heatmap(
        cross_model_result(["gen0", "gen1", "gen2"], [], [], metrics),
        metrics,
        root / "plots" / "sequential" / "bct" / "cross_model_heatmap.png",
    )
    sc = root / "metrics" / "sc"
    plot_curves(
        pd.read_parquet(sc / "backfill_curves.parquet"),
        BackfillSummary.read(sc / "backfill_summary.json"),
        root / "plots" / "sc" / "backfill_curves.png",
    )


def test_every_figure_reads_unscaled_in_a_1400_px_window(tmp_path: Path) -> None:
    """Each image of the report (heatmaps, backfill curves, the claims' curves) is shown at its
    natural size, at most the window's width: the text drawn in it (≥ 10.5 px,
    tests/test_report_figures.py) is read at that size."""
    study, replicates = write_seeds(tmp_path)
    write_real_figures(tmp_path)
    write_report(study, {}, {}, tmp_path / "out", replicates=replicates)
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    probe = tmp_path / "out" / "probe.html"
    probe.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = _chromium_run(tmp_path, probe.as_uri(), "--dump-dom", window=f"{WINDOW_PX},1000")
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.DOTALL)
    assert found, dom.stdout[-2000:]
    measured = json.loads(unescape(found.group(1)))
    images = {image["src"]: image for image in measured["images"]}
    assert sorted(images) == [
        "plots/bct__cross_model_heatmap.png",
        "plots/sc_backfill_curves.png",
        "plots/sc_claim_curves.png",
        "plots/sc_cross_model_heatmap.png",
    ]
    for src, image in images.items():
        assert 0 < image["natural"] <= WINDOW_PX, (src, image)
        assert abs(image["shown"] - image["natural"]) < 1, (src, image)  # not scaled down
    assert measured["table_font_px"] >= SMALLEST_TABLE_TEXT_PX
