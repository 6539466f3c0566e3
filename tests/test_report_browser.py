"""The HTML report as a reader sees it, in headless Chromium: it opens on what to use per scenario,
and no table cell runs to more than a few lines."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

import pytest

from modelupgrade.layout import StudyLayout
from modelupgrade.report import collect_results, write_report
from tests.test_mlflow_ui import CHROMIUM, _chromium_run, _visible_text
from tests.test_report import study_params, write_study

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
