"""The report's table of the settings where the study leaves the papers', read from the params."""

from __future__ import annotations

from pathlib import Path

import yaml

from modelupgrade.config import Params, parse_params
from modelupgrade.overrides import merge
from modelupgrade.report import write_report
from modelupgrade.report.results import StudyResults
from modelupgrade.report.settings import SettingRow, settings_against_papers

ROOT = Path(__file__).resolve().parents[1]


def study_params(overlay: dict | None = None) -> Params:
    base = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    return parse_params(merge(base, overlay or {}))


def rows_of(params: Params) -> dict[str, str]:
    return {row.setting: row.ours for row in settings_against_papers(params)}


def test_the_cpu_study_lists_what_it_changes_with_its_own_values() -> None:
    rows = rows_of(study_params())
    # Every model takes the same SGD steps (params.yaml's training.steps).
    assert rows["training length"].startswith(
        "750 SGD steps of 64 images for every model, old and new alike (48,000 images seen"
    )
    assert rows["training data"] == "fashion-mnist, 150 training images per class"
    assert rows["backbones"] == "resnet10t (stage widths 16/32/64/128), 64-d"
    assert rows["DMU's jointly trained ψ"] == "dmu: 256"
    assert "fct, fct_bct, fastfill" in rows["transformation heads"]
    # A study by epochs lists its epochs; UniBCT and the identical-data scenario show where
    # params/full-cpu.yaml runs them.
    overlay = yaml.safe_load((ROOT / "params/full-cpu.yaml").read_text(encoding="utf-8"))
    full = rows_of(study_params(merge(overlay, {"training": {"epochs": 5, "steps": None}})))
    assert full["training length"] == "5 epochs"
    assert full["UniBCT warm-up"] == "unibct: 9 epochs of 5 epochs"
    assert full["identical-data upgrade"] == (
        "softmax → default: resnet10t softmax → resnet10t arcface"
    )


def test_settings_at_the_papers_values_are_not_listed() -> None:
    gpu = yaml.safe_load((ROOT / "params" / "gpu-full.yaml").read_text(encoding="utf-8"))
    rows = rows_of(study_params(gpu))
    # ResNet-18 → ResNet-50, 30 epochs, UniBCT's 10 warm-up epochs, DMU's 1024, the heads' recipes.
    for setting in (
        "backbones",
        "training length",
        "UniBCT warm-up",
        "DMU's jointly trained ψ",
        "transformation heads",
        "identical-data upgrade",
    ):
        assert setting not in rows, setting
    assert "training data" in rows and "evaluation" in rows  # still Fashion-MNIST


def test_a_head_left_at_its_papers_recipe_is_not_listed() -> None:
    heads = {"fct": {"hidden_dim": None}, "bict": {"epochs": 12}}
    listed = rows_of(study_params({"heads": heads}))["transformation heads"]
    assert "fct," not in listed and "fct:" not in listed
    assert "bict: width 256, 12 epochs" in listed
    assert "bict_momentum, dmu: width 256, 30 epochs" in listed  # narrower than their papers'


def test_the_report_shows_the_table_and_leaves_it_out_when_empty(tmp_path: Path) -> None:
    row = SettingRow("training length", "30 epochs (BiCT)", "7 epochs", "the CPU budget")
    write_report(StudyResults([], settings=[row]), {}, {}, tmp_path / "with")
    markdown = (tmp_path / "with" / "report.md").read_text(encoding="utf-8")
    assert "## Settings against the papers" in markdown
    assert "| training length | 30 epochs (BiCT) | 7 epochs | the CPU budget |" in markdown
    write_report(StudyResults([]), {}, {}, tmp_path / "without")
    assert "Settings against" not in (tmp_path / "without" / "report.md").read_text()
