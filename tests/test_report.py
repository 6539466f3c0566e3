"""The reports: the one markdown/HTML renderer, the papers' claims on a synthetic study, the study
report's files, and the upgrade, lineage and backfill reports the flows publish."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from modelupgrade.config import Params, parse_params
from modelupgrade.layout import StudyLayout
from modelupgrade.registry import RegistrationSummary, VersionInfo
from modelupgrade.report import (
    check_claims,
    collect_replicates,
    collect_results,
    document,
    write_report,
)
from modelupgrade.report.claims import CLAIMS
from modelupgrade.report.upgrade import (
    BackfillOutcome,
    Chain,
    CycleOutcome,
    LineageOutcome,
    backfill_report,
    skipped_upgrade_report,
    write_lineage_report,
    write_skipped_upgrade_report,
    write_upgrade_report,
)
from tests.test_claims import CLAIM_RECORD_KEYS

# -- the renderer ----------------------------------------------------------------------------------


def test_markdown_renders_every_block_kind() -> None:
    blocks = [
        document.Heading("Part", 2),
        document.Paragraph("Some `code` text."),
        document.Table(
            ["name", "value", "ok", "missing"],
            [["a", 0.123456, True, None], ["b", 2, False, math.nan]],
        ),
        document.Image("plots/x.png", "a plot"),
        document.CodeBlock("root\n└── v1"),
        document.BulletList(["one: `1`", "two"]),
        document.Details("More", ["first", "second"]),
    ]
    assert document.render_markdown("Title", blocks) == (
        "# Title\n\n"
        "## Part\n\n"
        "Some `code` text.\n\n"
        "| name | value | ok | missing |\n|---|---|---|---|\n"
        "| a | 0.1235 | yes | – |\n| b | 2 | no | – |\n\n"
        "![a plot](plots/x.png)\n\n"
        "```text\nroot\n└── v1\n```\n\n"
        "- one: `1`\n- two\n\n"
        "**More**\n\n- first\n- second\n"
    )


def test_markdown_cells_cannot_break_the_table() -> None:
    text = document.render_markdown(
        "T", [document.Table(["a|b", "reason"], [["x | y", "line one\nline two"]])]
    )
    assert text.splitlines()[2:5] == [
        "| a\\|b | reason |",
        "|---|---|",
        "| x \\| y | line one line two |",
    ]


def test_html_escapes_text_and_shows_the_same_values() -> None:
    blocks = [
        document.Paragraph("a < b & c"),
        document.Table(["x"], [[None], [0.5], ["<b>"]]),
        document.CodeBlock("<tree>"),
        document.BulletList(["<i>"]),
        document.Image('p".png', "cap <1>"),
        document.Details("a > b", ["<x>"]),
    ]
    page = document.render_html("T & U", blocks)
    assert "<title>T &amp; U</title>" in page and "<h1>T &amp; U</h1>" in page
    assert "<p>a &lt; b &amp; c</p>" in page
    # Numbers right-aligned, text left-aligned (class "text").
    assert '<td>–</td></tr><tr><td>0.5000</td></tr><tr><td class="text">&lt;b&gt;</td>' in page
    assert "<pre><code>&lt;tree&gt;</code></pre>" in page and "<ul><li>&lt;i&gt;</li></ul>" in page
    assert '<img src="p&quot;.png" alt="cap &lt;1&gt;">' in page
    assert "<details><summary>a &gt; b</summary><ul><li>&lt;x&gt;</li></ul></details>" in page


# -- a synthetic study -----------------------------------------------------------------------------


def study_params(bct_name: str = "bct", bct_kind: str = "bct", seeds: Sequence[int] = ()) -> Params:
    """The synthetic study's params; with ``seeds``, the replicates that train ``sc`` and ``other``
    again at each."""
    replicates = {
        "seeds": list(seeds),
        "scenarios": {
            "sc": {
                "strategies": ["independent", bct_name, "dmu"],
                "heads": ["fct", "fastfill", "rm_full"],
                "backfill": True,
            },
            "other": {"strategies": [bct_name]},
        },
    }
    return parse_params(
        {
            "scenarios": {
                "sc": {
                    "kind": "extended-class",
                    "strategies": ["independent", bct_name, "dmu"],
                    "heads": {
                        "fct": "independent",
                        "rqt": "independent",
                        "fastfill": "independent",
                        "rm_full": "independent",
                    },
                },
                "other": {"kind": "open-data", "strategies": ["independent", bct_name]},
            },
            "architectures": {"default": {}},
            "strategies": {
                "independent": {"kind": "independent"},
                bct_name: {"kind": bct_kind},
                "dmu": {"kind": "dmu"},
            },
            "heads": {
                "fct": {"kind": "fct"},
                "rqt": {"kind": "rqt"},
                "fastfill": {"kind": "fastfill"},
                "rm_full": {"kind": "rm_full"},
            },
            "sequential": {"strategies": [bct_name]},
            **({"replicates": replicates} if seeds else {}),
        }
    )


def row(
    comparison: str,
    query: str,
    gallery: str,
    value: float,
    up: float,
    down: float,
    flips: float | None = None,
) -> dict[str, Any]:
    return {
        "comparison": comparison,
        "query_set": query,
        "gallery_set": gallery,
        "metric": "mAP",
        "value": value,
        "delta_up_pct": up,
        "delta_down_pct": down,
        "negative_flip_rate": float("nan") if flips is None else flips,
    }


def evaluation_summary(
    scenario: str, strategies: dict[str, list[dict[str, Any]]], **values: float
) -> dict:
    """A two-model scenario's summary.json as the evaluate stage writes it."""
    return {
        "scenario": scenario,
        "protocol": {"name": "sampled", "description": "sampled query-gallery"},
        "headline_metric": "mAP",
        "old_model": "gen0",
        "oracle": "gen1-independent",
        "device": "cpu",
        "strategies": strategies,
        **values,
    }


def curve(
    strategy: str,
    policy: str,
    mode: str,
    auc: float,
    monotone: bool = True,
    deployable: bool = True,
) -> dict[str, Any]:
    return {
        "strategy": strategy,
        "policy": policy,
        "mode": mode,
        "deployable": deployable,
        "auc_trapezoid": {"mAP": auc, "top1": auc + 0.1},
        "auc_mean": {"mAP": auc + 0.01, "top1": auc + 0.11},
        "conditions": {
            metric: {
                "starts_at_or_above_old": True,
                "ends_at_or_above_new": True,
                "monotone": monotone,
                "largest_drop": 0.0 if monotone else 0.0321,
            }
            for metric in ("mAP", "top1")
        },
        **{
            part: {"mAP": auc}
            for part in ("start", "end", "start_single_system", "end_single_system", "new_new")
        },
        "endpoints_match": True,
        "max_negative_flip_rate": 0.01,
    }


def model_fit(prototype_accuracy: float = 0.95) -> dict[str, Any]:
    """A model's convergence record as the evaluation writes it (it passed the gate)."""
    statistics = {
        "steps": 750.0,
        "images": 450.0,
        "loss_start": 7.66,
        "loss_end": 0.31,
        "loss_ratio": 0.0405,
        "prototype_accuracy": prototype_accuracy,
        "classifier_accuracy": 0.99,
        "classifier_agreement": 0.998,
        "collapse": 0.286,
    }
    return {"kind": "model", "statistics": statistics, "passed": True, "reasons": []}


def head_fit(alignment: float, passed: bool = True, **more: float) -> dict[str, Any]:
    """A head's convergence record (a failing one with the evaluation's reason)."""
    reason = (
        f"its output's mean cosine to the embedding it maps to is {alignment:.2f} on its "
        "training pairs (gate ≥ 0.70)"
    )
    reasons = [] if passed else [reason]
    statistics = {"alignment": alignment, "epochs": 80.0, "loss_start": 0.18, "loss_end": 0.002}
    return {
        "kind": "head",
        "statistics": {**statistics, **more},
        "passed": passed,
        "reasons": reasons,
    }


def convergence(shift: float) -> dict[str, Any]:
    """Every model and head of ``sc``: all converged but RQT's ψ (no claim rests on it)."""
    return {
        "gen0": model_fit(0.99),
        "gen1-independent": model_fit(),
        "gen1-bct": model_fit(0.93),
        "gen1-dmu": model_fit(0.94),
        # On the gallery, which neither trained on: a little lower, FastFill below FCT.
        "fct-independent": head_fit(0.94 + shift, held_out_alignment=0.92 + shift),
        "fastfill-independent": head_fit(0.95 + 2 * shift, held_out_alignment=0.90),
        "rqt-independent": head_fit(0.52, passed=False),
        "rm_full-independent": head_fit(math.nan, late_change=0.004),
    }


def write_curve_points(path: Path, curves: Sequence[dict[str, Any]]) -> None:
    """``backfill_curves.parquet`` of ``curves``: each rises by 0.1 over t = 0, 0.5, 1 around its
    trapezoid AUC (so the area is the AUC)."""
    rows = [
        {
            "strategy": c["strategy"],
            "policy": c["policy"],
            "mode": c["mode"],
            "deployable": c["deployable"],
            "permutations": 1,
            "t": t,
            "cutoff": int(100 * t),
            "mAP": c["auc_trapezoid"]["mAP"] + 0.1 * (t - 0.5),
            "top1": c["auc_trapezoid"]["top1"] + 0.1 * (t - 0.5),
        }
        for c in curves
        for t in (0.0, 0.5, 1.0)
    ]
    pd.DataFrame(rows).to_parquet(path)


def write_study(
    root: Path,
    bct_name: str = "bct",
    bct_backward: float = 0.45,
    shift: float = 0.0,
    other_backward: float = 0.35,
    outside: bool = False,
) -> None:
    """The files the evaluate and simulate_backfill stages write, for scenarios ``sc`` (every claim
    has its numbers, and each holds) and ``other`` (evaluation only; no head or adapter, but with
    ``outside`` BCT's FCT adapter, whose check lies outside the forward-adapter claim's scope).
    ``shift`` moves every number of ``sc`` (another training seed's draw)."""
    sc = root / "metrics" / "sc"
    sc.mkdir(parents=True)
    evaluation = evaluation_summary(
        "sc",
        old_self=0.40,
        oracle_self=0.70,
        strategies={
            "independent": [
                row("self", "gen1-independent", "gen1-independent", 0.70, 75.0, 0.0),
                row("backward", "gen1-independent", "gen0", 0.02, -95.0, 0.0, 0.9),
                row("forward-head", "gen1-independent", "fct-independent(gen0)", 0.45, 12.5, 0.0),
            ],
            bct_name: [
                row("self", f"gen1-{bct_name}", f"gen1-{bct_name}", 0.66, 65.0, 5.71),
                row("backward", f"gen1-{bct_name}", "gen0", bct_backward, 12.5, 5.71, 0.04),
            ],
            "dmu": [
                row("self", "gen1-dmu", "gen1-dmu", 0.69, 72.5, 1.43),
                row("backward", "gen1-dmu", "gen0", 0.50, 25.0, 1.43, 0.03),
                row("forward-head", "gen1-dmu", "dmu(gen0)", 0.55, 37.5, 1.43),
            ],
        },
    )
    evaluation["old_self"] += shift
    evaluation["oracle_self"] += shift
    for rows in evaluation["strategies"].values():
        for entry in rows:
            entry["value"] += shift
    evaluation["convergence"] = convergence(shift)
    (sc / "summary.json").write_text(json.dumps(evaluation))
    curves = [
        curve(bct_name, "random", "mixed", 0.50 + shift),
        curve("independent", "old-confidence", "rank-merge", 0.48 + shift),
        curve("rm_full-independent", "old-confidence", "rank-merge-full", 0.58 + shift),
        curve("fastfill-independent", "random", "mixed", 0.52 + shift),
        curve("fastfill-independent", "fastfill-uncertainty", "mixed", 0.60 + shift),
        curve("fct-independent", "random", "mixed", 0.50 + shift),
        curve(
            "independent", "oracle", "rank-merge", 0.62 + shift, monotone=False, deployable=False
        ),
    ]
    write_curve_points(sc / "backfill_curves.parquet", curves)
    backfill = {
        "scenario": "sc",
        "protocol": "query-gallery",
        "distance": "cosine",
        "curves": curves,
        "primary_auc": "auc_trapezoid",
        "gallery_size": 100,
        "queries": 20,
        "old_old": {"mAP": 0.4 + shift, "top1": 0.5 + shift},
        "grid": {"kind": "uniform", "t": [0.0, 0.5, 1.0], "cutoffs": [0, 50, 100]},
        "skipped": [],
        "policies_known": ["random"],
        "serving_modes_known": ["mixed"],
    }
    (sc / "backfill_summary.json").write_text(json.dumps(backfill))
    other = root / "metrics" / "other"
    other.mkdir(parents=True)
    (other / "summary.json").write_text(
        json.dumps(
            evaluation_summary(
                "other",
                old_self=0.30,
                oracle_self=0.60,
                strategies={
                    bct_name: [
                        row("self", f"gen1-{bct_name}", f"gen1-{bct_name}", 0.55, 80.0, 8.3),
                        row(
                            "backward",
                            f"gen1-{bct_name}",
                            "gen0",
                            other_backward,
                            100 * (other_backward / 0.30 - 1),
                            8.3,
                            0.05,
                        ),
                        *(
                            [row("forward-head", "gen1-bct", "fct_bct-bct(gen0)", 0.31, 3.3, 8.3)]
                            if outside
                            else []
                        ),
                    ]
                },
            )
        )
    )
    sequential = root / "metrics" / "sequential" / bct_name
    sequential.mkdir(parents=True)
    (sequential / "summary.json").write_text(
        json.dumps(
            {
                "strategy": bct_name,
                "protocol": {"protocol": "query-gallery"},
                "oracle": None,
                "headline_metric": "mAP",
                "compatibility": {
                    "mAP": {
                        "generations": ["gen0", "gen1", "gen2"],
                        "metric": "mAP",
                        "matrix": [[0.4, 0.0, 0.0], [0.42, 0.5, 0.0], [0.45, 0.52, 0.6]],
                        "ac_lt": 1.0,
                        "ac_le": 1.0,
                        "am": 0.4817,
                        "bc": 0.075,
                        "fc": 0.04,
                    }
                },
            }
        )
    )
    for plot in (
        "sc/cross_model_heatmap.png",
        "sc/backfill_curves.png",
        f"sequential/{bct_name}/cross_model_heatmap.png",
    ):
        (root / "plots" / plot).parent.mkdir(parents=True, exist_ok=True)
        (root / "plots" / plot).write_bytes(b"\x89PNG fake")


def claims_of(root: Path, params: Params, seeds: int = 5) -> list[Any]:
    """The claims on the study written under ``root``, as if each of ``seeds`` training seeds had
    given its numbers (a verdict is a test over seeds: one seed alone gives none)."""
    results = collect_results(
        params, StudyLayout(metrics_root=root / "metrics", plots_root=root / "plots")
    )
    return check_claims(results, [results] * (seeds - 1))


def own_seed(claim: Any) -> str:
    """The study's own seed's evidence of each check of a claim."""
    return "; ".join(check.draws[0].evidence for check in claim.checks) or claim.evidence


def test_every_claim_is_checked_where_the_study_has_its_numbers(tmp_path: Path) -> None:
    write_study(tmp_path)
    claims = claims_of(tmp_path, study_params())
    # The adapter claims (10, 11) have no adapter in this study to check.
    assert [c.verdict for c in claims] == ["holds"] * 9 + ["not tested"] * 2
    evidence = [own_seed(c) for c in claims]
    assert evidence[0] == (
        "sc: M(BCT, old) = 0.4500 vs M(old, old) = 0.4000; "
        "other: M(BCT, old) = 0.3500 vs M(old, old) = 0.3000"
    )
    assert evidence[1] == (
        "sc: M(BCT, BCT) = 0.6600 vs independent 0.7000; "
        "other: M(BCT, BCT) = 0.5500 vs independent 0.6000"
    )
    assert evidence[2] == "sc: Δ↑ DMU through ψ 37.50% vs BCT 12.50%; sc: Δ↓ DMU 1.43% vs BCT 5.71%"
    assert evidence[3] == (
        "sc: M(gen1-independent, fct-independent(gen0)) = 0.4500 vs M(old, old) = 0.4000; "
        "sc: M(gen1-dmu, dmu(gen0)) = 0.5500 vs M(dmu, old) = 0.5000"
    )
    assert evidence[4] == (
        "sc rm_full-independent: AUC mAP 0.5800 vs naive rank merge 0.4800; "
        "sc rm_full-independent: AUC top1 0.6800 vs naive rank merge 0.5800"
    )
    # The oracle order is not deployable; the study's 20 queries make one query's worth 0.05.
    assert evidence[5] == (
        "sc independent/old-confidence mAP: largest dip 0.0000 (tolerance 0.0500, one query's "
        "worth); sc independent/old-confidence top1: largest dip 0.0000 (tolerance 0.0500, one "
        "query's worth)"
    )
    # FastFill's M̃ is the mean of the curve's points (auc_mean), not the trapezoid.
    assert evidence[6] == (
        "sc fastfill-independent: mean mAP σ² order 0.6100 vs random 0.5300; "
        "sc fastfill-independent: mean top1 σ² order 0.7100 vs random 0.6300"
    )
    # FastFill against FCT (FCT backfilled at random, as FastFill's tables do): its whole method,
    # and its loss alone.
    assert evidence[7:9] == [
        (
            "sc fastfill-independent: mean mAP σ² order 0.6100 vs FCT random 0.5100; "
            "sc fastfill-independent: mean top1 σ² order 0.7100 vs FCT random 0.6100"
        ),
        (
            "sc fastfill-independent: mean mAP random 0.5300 vs FCT random 0.5100; "
            "sc fastfill-independent: mean top1 random 0.6300 vs FCT random 0.6100"
        ),
    ]
    # Five seeds behind each tested claim; none behind an untested one.
    assert [c.seeds for c in claims] == [0 if c.verdict == "not tested" else 5 for c in claims]
    assert {c.verdict for c in claims} == {"holds", "not tested"}


def test_a_claim_the_numbers_contradict_fails(tmp_path: Path) -> None:
    write_study(tmp_path, bct_backward=0.39)
    compatible = claims_of(tmp_path, study_params())[0]
    assert compatible.holds is False and compatible.verdict == "fails"
    assert "sc: M(BCT, old) = 0.3900 vs M(old, old) = 0.4000" in own_seed(compatible)


def test_claims_find_their_strategies_by_kind_and_say_when_untested(tmp_path: Path) -> None:
    write_study(tmp_path, bct_name="compat")
    claims = claims_of(tmp_path, study_params("compat"))
    assert claims[0].holds and own_seed(claims[0]).startswith("sc: M(COMPAT, old) = 0.4500")
    assert own_seed(claims[2]).endswith("sc: Δ↓ DMU 1.43% vs COMPAT 5.71%")

    write_study(tmp_path / "again")
    # No strategy of kind bct: the BCT claims have nothing to check.
    claims = claims_of(tmp_path / "again", study_params(bct_kind="independent"))
    assert (claims[0].holds, claims[0].evidence) == (None, "BCT was not evaluated")
    assert claims[0].verdict == "not tested" and claims[2].holds is None


def test_write_report_writes_markdown_html_claims_and_the_plots(tmp_path: Path) -> None:
    write_study(tmp_path)
    study = collect_results(
        study_params(),
        StudyLayout(metrics_root=tmp_path / "metrics", plots_root=tmp_path / "plots"),
    )
    # Five seeds that measured the same numbers: the claims are tested (one seed gives no test).
    written = write_report(
        study,
        {"git commit": "abc"},
        # The report's own run only logs the report (milliseconds): not a stage time to show.
        {"evaluate@sc": 4.25, "report": 0.05},
        tmp_path / "out",
        replicates=[study] * 4,
    )
    assert [p.name for p in written] == ["report.md", "report.html", "claims.json"]
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "| evaluate@sc | 4.2 |" in markdown and "| report |" not in markdown
    assert "(seconds, 4 s in all)" in markdown
    assert markdown.startswith("# modelupgrade study\n")
    assert "## Do the papers' claims hold here?" in markdown
    assert "## Scenario sc" in markdown and "## Scenario other" in markdown
    # M to 3 decimals, percentages to 1.
    assert "| bct | 0.660 | 0.450 | – | – | 12.5 | 5.7 | 0.040 |" in markdown
    assert (
        "| independent | 0.700 | 0.020 | 0.450 | fct-independent(gen0) | 12.5 | 0.0 | 0.900 |"
    ) in markdown
    assert (
        "| gen2 | 0.450 | 0.520 | 0.600 |" in markdown
        and "| gen1 | 0.420 | 0.500 | – |" in markdown
    )
    assert "| evaluate@sc | 4.2 |" in markdown
    assert sorted(p.name for p in (tmp_path / "out" / "plots").iterdir()) == [
        "bct__cross_model_heatmap.png",
        "sc_backfill_curves.png",
        "sc_claim_curves.png",
        "sc_cross_model_heatmap.png",
    ]
    assert "![sc: backfill curves](plots/sc_backfill_curves.png)" in markdown
    claims = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert [c["verdict"] for c in claims] == ["holds"] * 9 + ["not tested"] * 2
    assert all(list(c) == CLAIM_RECORD_KEYS for c in claims)
    dmu = claims[2]
    assert (dmu["source"], dmu["seeds"]) == ("DMU (Table 1)", 5)
    assert dmu["scope"]["scenarios"] == ["extended-data", "open-data", "extended-class"]
    assert dmu["ours"] == "sc: Δ↑ 37.50 ± 0.00 vs 12.50 ± 0.00%; sc: Δ↓ 1.43 ± 0.00 vs 5.71 ± 0.00%"
    assert "The study's own seed: sc: Δ↑ DMU through ψ 37.50% vs BCT 12.50%" in dmu["evidence"]
    assert claims[5]["paper"] is None
    # The claims table: claim | source | paper | ours | verdict, each cell a few lines at most.
    table = markdown.split("## Do the papers' claims hold here?")[1].split("\n\n")[4].splitlines()
    assert table[0] == "| claim | source | paper | ours | verdict |"
    cells = [cell for line in table[2:] for cell in line.strip("|").split(" | ")]
    assert len(table) == 2 + len(CLAIMS) and max(len(cell) for cell in cells) <= 240
    dmu_row = table[4]
    assert dmu_row.startswith("| 3. DMU upgrades better than BCT on both sides")
    assert dmu_row.endswith(
        "| GLDv2, DMU vs BCT: Δ↑ 19.18 vs 11.57%, Δ↓ 2.27 vs 4.03% (30%→100% data); "
        "Δ↑ 14.63 vs 9.56%, Δ↓ −0.42 vs 0.80% (30%→70% data) | "
        "sc: Δ↑ 37.50 ± 0.00 vs 12.50 ± 0.00%; sc: Δ↓ 1.43 ± 0.00 vs 5.71 ± 0.00% | holds |"
    )
    assert "| 6. " in table[7] and "| – |" in table[7]  # Seo et al. give figures only
    # The evidence in full below the table, one list per claim.
    assert "**3. DMU upgrades better than BCT on both sides" in markdown
    assert "- Source: DMU (Table 1)." in markdown
    assert "The study's own seed: sc: Δ↑ DMU through ψ 37.50% vs BCT 12.50%" in markdown
    page = (tmp_path / "out" / "report.html").read_text()
    assert '<td class="text">DMU (Table 1)</td>' in page
    assert "<details><summary>3. DMU upgrades better than BCT on both sides" in page


# -- the flows' reports ----------------------------------------------------------------------------


class FakeRegistry:
    """The part of ``ModelRegistry`` the reports read, without an MLflow store."""

    name = "tiny-flows-sequential"
    tracker = SimpleNamespace(config=SimpleNamespace(tracking_uri="sqlite:///tmp/mlflow.db"))

    def __init__(self) -> None:
        gate_tags = {
            "gates.passed": "true",
            "gates.against_version": "1",
            "gate.compatibility": "pass: 0.42 > 0.40",
            "gate.compatibility.value": "0.42",
            "gate.negative_flips": "pass: 0.03 <= 0.1",
        }
        self._versions = [
            VersionInfo(
                1,
                {
                    "model_key": "gen0",
                    "generation": "gen0",
                    "strategy": "initial",
                    "parent_version": "none",
                    "gates.passed": "first-generation",
                },
                ["champion"],
                None,
            ),
            VersionInfo(
                2,
                {
                    "model_key": "bct/gen1",
                    "generation": "gen1",
                    "strategy": "bct",
                    "parent_version": "1",
                    "compatible_with": "1",
                    **gate_tags,
                },
                ["candidate"],
                None,
            ),
        ]

    def versions(self) -> list[VersionInfo]:
        return self._versions

    def version(self, version: int) -> VersionInfo:
        return self._versions[version - 1]


def write_chain(root: Path) -> Chain:
    metrics = root / "metrics"
    metrics.mkdir(parents=True)
    pd.DataFrame(
        [
            ("gen1", "gen0", "mAP", 0.42),
            ("gen1", "gen0", "top1", 0.6),
            ("gen1", "gen1", "mAP", 0.5),
            ("gen1", "gen1", "top1", math.nan),
            ("gen0", "gen0", "mAP", 0.4),
        ],
        columns=["query_set", "gallery_set", "metric", "value"],
    ).to_parquet(metrics / "cross_model.parquet")
    (metrics / "summary.json").write_text(
        json.dumps(
            {
                "scenario": "sequential",
                "strategy": "bct",
                "protocol": {"protocol": "query-gallery"},
                "headline_metric": "mAP",
                "oracle": None,
                "compatibility": {
                    "mAP": {
                        "generations": ["gen0", "gen1"],
                        "metric": "mAP",
                        "matrix": [[0.4, 0.0], [0.42, 0.5]],
                        "ac_lt": 1.0,
                        "ac_le": 1.0,
                        "am": 0.44,
                        "bc": 0.02,
                        "fc": None,
                    }
                },
            }
        )
    )
    registry: Any = FakeRegistry()
    return Chain(registry, "bct", "mAP", metrics, root / "heatmap.png", root / "reports")


LINEAGE = (
    "tiny-flows-sequential\n"
    "└── v1 gen0  parent=-  strategy=initial  gates=first-generation  compatible_with=none  "
    "[champion]\n"
    "    └── v2 bct/gen1  parent=v1  strategy=bct  gates=pass  compatible_with=1  [candidate]"
)
MATRIX = (
    "M(query generation, gallery generation) in mAP; lower triangle: a newer model searching an "
    "older gallery.\n\n"
    "| query | gen0 | gen1 |\n|---|---|---|\n| gen0 | 0.4000 |  |\n| gen1 | 0.4200 | 0.5000 |\n\n"
    "AC(<) 1.0000, AC(≤) 1.0000, AM 0.4400, BC 0.0200, FC –"
)


def test_upgrade_report_tells_the_cycle_with_gates_metrics_matrix_and_lineage(
    tmp_path: Path,
) -> None:
    chain = write_chain(tmp_path)
    snapshot = tmp_path / "gen1.parquet"
    pd.DataFrame({"label": [0, 1, 1, 2]}).to_parquet(snapshot)
    registration = {
        "registered_model": "tiny-flows-sequential",
        "tracking_uri": "sqlite:///tmp/mlflow.db",
        "gate_metric": "mAP",
        "champion": 1,
        "candidate": 2,
        "generations": [
            {
                "model_key": "bct/gen1",
                "version": 2,
                "gates": "pass",
                "failed_gates": [],
                "aliases": ["candidate"],
            }
        ],
    }
    report = write_upgrade_report(
        chain,
        1,
        "bct/gen1",
        RegistrationSummary.from_dict(registration),
        snapshot,
        tmp_path / "gen1.json",
    )
    assert report.markdown == (
        "# Upgrade cycle gen1: bct/gen1 passed the gates and is the candidate\n\n"
        "|  |  |\n|---|---|\n"
        "| registered model | `tiny-flows-sequential` v2 (parent v1) |\n"
        "| strategy | bct |\n"
        f"| training data | `{snapshot}`: 4 images, 3 classes |\n"
        "| champion | v1 |\n| candidate | v2 |\n| MLflow | `sqlite:///tmp/mlflow.db` |\n\n"
        "## Gates against the champion (v1)\n\n"
        "| gate | verdict | detail |\n|---|---|---|\n"
        "| compatibility | pass | 0.42 > 0.40 |\n| negative_flips | pass | 0.03 <= 0.1 |\n\n"
        "## gen1 queries against every gallery of the chain\n\n"
        "| query | gallery | mAP | top1 |\n|---|---|---|---|\n"
        "| gen1 | gen0 | 0.4200 | 0.6000 |\n| gen1 | gen1 | 0.5000 | – |\n\n"
        f"## Compatibility matrix\n\n{MATRIX}\n\n"
        f"## Lineage\n\n```text\n{LINEAGE}\n```\n\n"
        "## Files\n\n"
        f"- metrics: `{tmp_path / 'metrics'}`\n- heatmap: `{tmp_path / 'heatmap.png'}`\n"
        f"- registration: `{tmp_path / 'gen1.json'}`\n"
    )
    assert report.path == tmp_path / "reports" / "upgrade-gen1.md"
    assert report.path.read_text() == report.markdown
    assert report.rows == [
        {"query": "gen1", "gallery": "gen0", "mAP": 0.42, "top1": 0.6},
        {"query": "gen1", "gallery": "gen1", "mAP": 0.5, "top1": None},
    ]
    record = json.loads(report.path.with_suffix(".json").read_text())
    assert record == report.record and record["metrics"] == report.rows
    assert (record["status"], record["version"], record["report"]) == (
        "registered",
        2,
        str(report.path),
    )
    # What `python -m flows.upgrade` prints of the same record.
    assert CycleOutcome(report.record).describe() == (
        "registered bct/gen1 as tiny-flows-sequential v2 (gates: pass; aliases: candidate)\n"
        f"report:   {report.path}\n"
        "MLflow:   sqlite:///tmp/mlflow.db  (modelupgrade lineage --model tiny-flows-sequential)"
    )


def test_lineage_report_holds_the_tree_and_the_matrix(tmp_path: Path) -> None:
    report = write_lineage_report(write_chain(tmp_path))
    assert report.markdown == (
        "# Lineage of `tiny-flows-sequential`: 2 generations (bct)\n\n"
        f"```text\n{LINEAGE}\n```\n\n## Compatibility matrix\n\n{MATRIX}\n\n"
        f"Heatmap: `{tmp_path / 'heatmap.png'}`\n"
    )
    assert report.rows == [
        {"query": "gen0", "gen0": 0.4, "gen1": None},
        {"query": "gen1", "gen0": 0.42, "gen1": 0.5},
    ]
    compat = report.record["compatibility"]
    assert compat["metric"] == "mAP" and compat["matrix"] == report.rows and compat["fc"] is None
    assert [r["model"] for r in report.record["lineage"]] == ["gen0", "bct/gen1"]
    assert json.loads(report.path.with_suffix(".json").read_text()) == report.record
    # What `python -m flows.lineage` prints of the same record.
    assert LineageOutcome(report.record).describe() == (
        "tiny-flows-sequential (sqlite:///tmp/mlflow.db): 2 versions\n"
        "  v1 gen0  parent=-  gates=first-generation  compatible_with=none  aliases=champion\n"
        "  v2 bct/gen1  parent=1  gates=pass  compatible_with=1  aliases=candidate\n"
        "compatibility matrix, mAP (rows: query generation, columns: gallery generation):\n"
        "            gen0    gen1\n"
        "  gen0    0.4000        \n"
        "  gen1    0.4200  0.5000\n"
        f"report:  {report.path}\n"
        f"heatmap: {tmp_path / 'heatmap.png'}\n"
        f"metrics: {tmp_path / 'metrics'}"
    )


def test_backfill_and_skipped_cycle_reports() -> None:
    summary = {
        "store": "runs/flows/store",
        "outcome": "backfilled gen0 → gen1",
        "source_space": "gen0",
        "champion_version": 2,
        "champion_key": "bct/gen1",
        "backfill": {
            "target_space": "gen1",
            "status": "complete",
            "items_written": 10,
            "items_failed": 1,
            "seconds": 2.04,
            "items_per_second": 4.9,
        },
        "store_status": {
            "serving_space": "gen1",
            "items_by_space": {"gen1": 10},
            "failed": [{"item_id": "a7", "reason": "image | unreadable"}],
        },
    }
    assert backfill_report(summary) == (
        "# Gallery store `runs/flows/store`: backfilled gen0 → gen1\n\n"
        "|  |  |\n|---|---|\n| from → to | gen0 → gen1 |\n| status | complete |\n"
        "| items written | 10 |\n| items failed | 1 |\n| seconds | 2.0 |\n| items/s | 4.9 |\n\n"
        "Serving space: `gen1`; items per space: {'gen1': 10}; champion: v2 (bct/gen1).\n\n"
        "Failed items (still served from the old space):\n\n"
        "| item | reason |\n|---|---|\n| a7 | image \\| unreadable |\n"
    )
    created = {
        "store": "s",
        "outcome": "created, serving gen0",
        "champion_version": 1,
        "champion_key": "gen0",
        "store_status": {"serving_space": "gen0", "items_by_space": {}},
    }
    assert backfill_report(created) == (
        "# Gallery store `s`: created, serving gen0\n\n"
        "Serving space: `gen0`; items per space: {}; champion: v1 (gen0).\n"
    )
    assert skipped_upgrade_report(3, Path("work/splits"), 3) == (
        "# Upgrade cycle gen3: no new data\n\n"
        "There is no data snapshot for gen3 in `work/splits` (sequential.fractions plans 3 "
        "generations), so nothing was trained or registered. Give the next snapshot with "
        "`python -m flows.upgrade --snapshot <parquet>` or the deployment's `snapshot` parameter.\n"
    )
    # What `python -m flows.backfill` prints of an outcome, once its report is written.
    assert BackfillOutcome({**created, "report": "r/backfill.md"}).describe() == (
        "store s: created, serving gen0\nreport: r/backfill.md"
    )
    nothing = {"store": "s", "outcome": "no champion yet: nothing to serve"}
    assert BackfillOutcome(nothing).describe() == "store s: no champion yet: nothing to serve"


def test_a_skipped_cycle_writes_its_report_and_says_so(tmp_path: Path) -> None:
    report = write_skipped_upgrade_report(3, Path("work/splits"), 3, tmp_path)
    assert report.record == {
        "status": "skipped",
        "generation": 3,
        "reason": "no data snapshot",
        "report": str(tmp_path / "upgrade-gen3.md"),
    }
    assert report.path.read_text() == skipped_upgrade_report(3, Path("work/splits"), 3)
    assert report.title == "gen3: no new data"
    assert CycleOutcome(report.record).describe() == (
        "gen3: no new data snapshot, nothing trained or registered"
    )


# The replicates' seeds, with how far each moves the numbers of ``sc`` and BCT's M(new, old) on
# ``other`` (M(old, old) 0.30 there: BCT beats it on three seeds of five).
REPLICATES = {1666: (0.01, 0.29), 2666: (-0.01, 0.36), 3666: (0.02, 0.33), 4666: (-0.02, 0.28)}


def write_seeds(root: Path, outside: bool = False) -> tuple[Any, list[Any]]:
    """The study at its own seed under ``root`` and at each seed of ``REPLICATES`` under
    ``root/replicates`` as the replicates stage leaves them; both read back as the report stage
    reads them."""
    params = study_params(seeds=list(REPLICATES))
    write_study(root, outside=outside)
    for seed, (shift, other_backward) in REPLICATES.items():
        write_study(
            root / "replicates" / f"seed-{seed}",
            shift=shift,
            other_backward=other_backward,
            outside=outside,
        )
    study = collect_results(params, StudyLayout(root))
    return study, collect_replicates(params, root / "replicates")


def test_the_report_leads_with_the_best_option_per_scenario_over_the_seeds(
    tmp_path: Path,
) -> None:
    """The best search of the old gallery over every strategy and head (not the self-test), and
    the best deployable backfill (the oracle's larger AUC is not one), each by its mean over the
    seeds; a scenario without a head or adapter is flagged."""
    study, replicates = write_seeds(tmp_path)
    write_report(study, {}, {}, tmp_path / "out", replicates=replicates)
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert markdown.index("## What to use, per scenario") < markdown.index("## Do the papers'")
    # sc moves by 0, ±0.01, ±0.02: sd 0.0158; DMU's ψ beats M(old, old) on every seed.
    assert (
        "| sc | 5 | 0.400 ± 0.016 | 0.700 ± 0.016 | gen1-dmu → dmu(gen0) | 0.550 ± 0.016 | "
        "+37.5 ± 0.0 | 5/5 seeds | ψ over every stored vector, once (no image) | "
        "fastfill-independent · fastfill-uncertainty · mixed | 0.600 ± 0.016 (5 seeds) | 2 heads |"
    ) in markdown
    # other: BCT's M(new, old) 0.35, 0.29, 0.36, 0.33, 0.28 (mean 0.322) against 0.30.
    assert (
        "| other | 5 | 0.300 ± 0.000 | 0.600 ± 0.000 | gen1-bct → gen0 | 0.322 ± 0.036 | "
        "+7.3 ± 11.9 | 3/5 seeds | nothing: new queries on the stored vectors | – | – | "
        "none: only the strategies' own models |"
    ) in markdown
    assert "No head or adapter was tried in other:" in markdown


def test_the_lead_keeps_the_old_system_where_nothing_beats_it_on_average(tmp_path: Path) -> None:
    from modelupgrade.report.lead import KEEP_OLD, lead_blocks

    study, _ = write_seeds(tmp_path)
    other = study.scenarios[1]
    worse = other.evaluation.model_copy(
        update={
            "strategies": {
                "bct": [
                    r.model_copy(update={"value": 0.25}) if r.comparison == "backward" else r
                    for r in other.evaluation.strategies["bct"]
                ]
            }
        }
    )
    study.scenarios[1] = dataclasses.replace(other, evaluation=worse)
    text = document.render_markdown("t", lead_blocks([study]))
    assert f"| 0.250 | +16.7 | 0/1 seed | {KEEP_OLD} |" in text


# Python's repr of an object (``SeededCheck(draws=…``, ``np.float64(…``, ``array(…``) or of a dict.
REPR = re.compile(r"\b[A-Z][A-Za-z]+\(|\bnp\.[a-z0-9_]+\(|\barray\(|\{'")


def test_the_report_shows_no_python_repr(tmp_path: Path) -> None:
    """A report of five seeds, with a check outside its claim's scope (the evidence of those once
    showed ``SeededCheck(draws=(Check(…`` reprs), has nothing Python would print for an object."""
    study, replicates = write_seeds(tmp_path, outside=True)
    write_report(
        study,
        {"git commit": "abc"},
        {"evaluate@sc": 4.25},
        tmp_path / "out",
        replicates=replicates,
    )
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "Outside the scope, not counted: other: M(gen1-bct, fct_bct-bct(gen0))" in markdown
    for name in ("report.md", "report.html"):
        text = (tmp_path / "out" / name).read_text()
        assert REPR.findall(text) == [], [
            text[max(0, m.start() - 80) : m.end() + 80] for m in REPR.finditer(text)
        ][:3]


def test_the_model_table_shows_each_models_fit_and_the_gates_verdict(tmp_path: Path) -> None:
    study, replicates = write_seeds(tmp_path)
    write_report(study, {}, {}, tmp_path / "out", replicates=replicates)
    markdown = (tmp_path / "out" / "report.md").read_text()
    section = markdown.split("## Did every model and head train?")[1].split("\n## ")[0]
    rows = [
        [cell.strip() for cell in line.strip("| ").split(" | ")]
        for line in section.splitlines()
        if line.startswith("| ")
    ]
    # FastFill's ψ beside FCT's over the seeds: 0.95 + 2s against 0.94 + s on their training
    # images, 0.90 against 0.92 + s on the gallery.
    assert rows[:3] == [
        ["scenario", "new model", "images", "FastFill ψ", "FCT ψ", "FastFill − FCT", "seeds"],
        ["sc", "independent", "training", "0.950 ± 0.032", "0.940 ± 0.016", "+0.010 ± 0.016", "5"],
        [
            "sc",
            "independent",
            "gallery (held out)",
            "0.900 ± 0.000",
            "0.920 ± 0.016",
            "-0.020 ± 0.016",
            "5",
        ],
    ]
    model = ["model", "750 steps", "7.66 → 0.31"]
    head = ["80 epochs", "0.18 → 0.002", "–", "–", "–"]
    # Models first, then the trained heads, each with its statistics and the gate's verdict.
    assert rows[3][-3:] == ["late change %", "gate (this seed)", "passed on seeds"]
    assert rows[4:] == [
        ["gen0", *model, "0.990", "0.998", "0.286", "–", "–", "passes", "5/5"],
        ["gen1-bct", *model, "0.930", "0.998", "0.286", "–", "–", "passes", "5/5"],
        ["gen1-dmu", *model, "0.940", "0.998", "0.286", "–", "–", "passes", "5/5"],
        ["gen1-independent", *model, "0.950", "0.998", "0.286", "–", "–", "passes", "5/5"],
        ["fastfill-independent", "trained head (fastfill)", *head, "0.950", "–", "passes", "5/5"],
        ["fct-independent", "trained head (fct)", *head, "0.940", "–", "passes", "5/5"],
        ["rm_full-independent", "trained head (rm_full)", *head, "–", "0.4", "passes", "5/5"],
        ["rqt-independent", "trained head (rqt)", *head, "0.520", "–", "fails", "0/5"],
    ]
    # Each failure with its reason, seed by seed.
    assert (
        "- rqt-independent, seed 1666: its output's mean cosine to the embedding it maps to is "
        "0.52 on its training pairs (gate ≥ 0.70)"
    ) in section
    assert section.count("- rqt-independent, seed ") == 5


def test_the_claims_curves_are_drawn_over_the_seeds_with_a_band(tmp_path: Path) -> None:
    from modelupgrade.report.claim_curves import claim_curves_figure, claim_panels

    study, replicates = write_seeds(tmp_path)
    seeds = [study, *replicates]
    panels = claim_panels(check_claims(study, replicates))
    # Seo et al.'s full vs naive rank merge (5), RM_naive's monotonicity (6), FastFill's σ² vs
    # random order (7), FastFill's σ² order (8) and random order (9) vs FCT's random order: each
    # in mAP and top-1.
    assert [(p.claim, p.metric, [(c.system, c.policy) for c in p.curves]) for p in panels] == [
        (5, metric, [("rm_full-independent", "old-confidence"), ("independent", "old-confidence")])
        for metric in ("mAP", "top1")
    ] + [(6, metric, [("independent", "old-confidence")]) for metric in ("mAP", "top1")] + [
        (
            7,
            metric,
            [("fastfill-independent", "fastfill-uncertainty"), ("fastfill-independent", "random")],
        )
        for metric in ("mAP", "top1")
    ] + [
        (claim, metric, [("fastfill-independent", policy), ("fct-independent", "random")])
        for claim, policy in ((8, "fastfill-uncertainty"), (9, "random"))
        for metric in ("mAP", "top1")
    ]
    fig = claim_curves_figure(panels, seeds, "sc")
    assert fig is not None and len(fig.axes) == 10
    fastfill = fig.axes[4]
    labels = [text.get_text() for text in fastfill.get_legend().get_texts()]
    assert labels == [
        "fastfill-independent · fastfill-uncertainty (5 seeds)",
        "fastfill-independent · random (5 seeds)",
        "M(old, old) = 0.400",
    ]
    # The σ² order's mean curve, 0.55 → 0.65, in a band of its seeds' sd (0.0158) either side.
    line = fastfill.get_lines()[0]
    assert list(line.get_ydata()) == pytest.approx([0.55, 0.60, 0.65])
    band = fastfill.collections[0].get_paths()[0].vertices[:, 1]
    assert (band.min(), band.max()) == pytest.approx((0.55 - 0.0158, 0.65 + 0.0158), abs=1e-4)


def test_a_claim_panel_holds_at_most_eight_curves() -> None:
    from modelupgrade.report.claim_curves import MAX_CURVES, claim_panels
    from modelupgrade.report.claims import CurveRef

    refs = tuple(CurveRef("sc", f"s{i}", "random", "mixed", "mAP") for i in range(11))
    check = SimpleNamespace(draws=[SimpleNamespace(curves=refs)])
    claim = SimpleNamespace(statement="many curves", checks=[check])
    panels = claim_panels([claim])
    assert [len(p.curves) for p in panels] == [MAX_CURVES, 11 - MAX_CURVES]
    assert [c for p in panels for c in p.curves] == list(refs)


def test_run_metadata_names_the_replicates_seeds(tmp_path: Path) -> None:
    from modelupgrade.report import run_metadata

    study, _ = write_seeds(tmp_path)
    metadata = run_metadata(study_params(seeds=list(REPLICATES)), study)
    assert metadata["seed"].startswith("666 ")
    assert metadata["replicate seeds"] == "1666, 2666, 3666, 4666"
    assert run_metadata(study_params(), study)["replicate seeds"] == "none"
