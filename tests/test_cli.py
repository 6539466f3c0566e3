"""The ``modelupgrade`` command: every option explained, the study on tiny data without DVC (the
same files as the stages write), and bad input answered with a clear message and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import typer
import yaml
from typer.testing import CliRunner

from modelupgrade.cli import app
from modelupgrade.config import parse_params

WORKFLOW = ("train", "embed", "evaluate", "simulate-backfill")
PIXELS = torch.randint(0, 256, (80, 1, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
PARAMS = {
    "seed": 7,
    "device": "cpu",
    "scenarios": {"toy": {"kind": "extended-data", "strategies": ["independent", "bct"]}},
    "architectures": {
        "default": {"backbone": "resnet10t", "backbone_kwargs": {"channels": [8, 8, 8, 8], "stem_width": 8},
                    "cifar_stem": False, "embedding_dim": 8},
    },
    "training": {"epochs": 1, "batch_size": 16},
    "strategies": {"independent": {"kind": "independent"}, "bct": {"kind": "bct"}},
    "sequential": {"strategies": []},
    "backfill": {"points": 3, "policies": ["random"], "serving_modes": ["mixed"]},
}


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """params.yaml and a scenario's split files in the pipeline's layout; images come from PIXELS."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("modelupgrade.data.load_images",
                        lambda frame, dataset: PIXELS[torch.as_tensor(frame["index"].to_numpy().copy())])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    root = tmp_path / "data/splits/toy"
    root.mkdir(parents=True)
    for name, rows in (("old_train", range(0, 32)), ("new_train", range(0, 64)), ("query", range(64, 72)),
                       ("gallery", range(72, 80))):
        pd.DataFrame({
            "item_id": [f"i{r}" for r in rows], "label": [r % 4 for r in rows], "class_name": [f"c{r % 4}" for r in rows],
            "source_split": "train", "path": "x.idx", "index": list(rows),
        }).to_parquet(root / f"{name}.parquet")
    return tmp_path


def invoke(runner: CliRunner, *args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_help_lists_the_commands_and_explains_every_option(runner: CliRunner) -> None:
    listing = invoke(runner, "--help")
    for name in (*WORKFLOW, "store-ingest", "backfill", "search", "serve", "promote", "lineage"):
        assert name in listing
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name in WORKFLOW:
        assert commands[name].help, f"{name} has no description"
        unexplained = [p.name for p in commands[name].params if not getattr(p, "help", None)]
        assert not unexplained, f"{name}: options without help: {unexplained}"
        assert "--params" in invoke(runner, name, "--help")
    assert "[default: params.yaml]" in invoke(runner, "evaluate", "--help")


def test_the_study_without_dvc_writes_what_the_stages_write(runner: CliRunner, project: Path) -> None:
    from stages import evaluate

    trained = invoke(runner, "train", "--scenario", "toy", "--no-progress")
    assert "trained models/toy/gen0" in trained and "final_loss" in trained
    for strategy in ("independent", "bct"):
        invoke(runner, "train", "--scenario", "toy", "--generation", "1", "--strategy", strategy, "--no-progress")
    card = json.loads((project / "models/toy/gen1-bct/card.json").read_text())
    assert card["parent"]["path"] == "models/toy/gen0"  # the default --old of generation 1
    assert card["data"]["split"] == "data/splits/toy/new_train.parquet" and card["seed"] == 8

    for model in ("gen0", "gen1-independent", "gen1-bct"):
        written = invoke(runner, "embed", "--scenario", "toy", "--model", f"models/toy/{model}")
        assert f"embeddings/toy/{model}/gallery.npy" in written
    assert (project / "embeddings/toy/gen1-bct/query.npy").is_file()

    evaluated = invoke(runner, "evaluate", "--scenario", "toy")
    assert "bct.backward.mAP" in evaluated and "bct.delta_down_pct" in evaluated
    params = parse_params(PARAMS)
    evaluate.run(params, "toy", metrics_root="stage-metrics", plots_root="stage-plots")
    for name in ("summary.json", "cross_model.csv"):
        assert (project / "metrics/toy" / name).read_bytes() == (project / "stage-metrics/toy" / name).read_bytes()

    simulated = invoke(runner, "simulate-backfill", "--scenario", "toy")
    assert "bct.random.mixed.auc_trapezoid.mAP" in simulated
    summary = json.loads((project / "metrics/toy/backfill_summary.json").read_text())
    assert {c["strategy"] for c in summary["curves"]} == {"independent", "bct"}
    assert (project / "plots/toy/backfill_curves.png").is_file()

    explicit = invoke(runner, "simulate-backfill", "--scenario", "toy", "--old", "embeddings/toy/gen0",
                      "--variant", "bct=embeddings/toy/gen1-bct", "--metrics-dir", "explicit")
    assert "1 backfill curves written to explicit" in explicit


@pytest.mark.parametrize(("args", "message"), [
    (("train", "--scenario", "toy", "--generation", "1", "--strategy", "nope"), "unknown strategy 'nope'"),
    (("train", "--split", "data/splits/toy/old_train.parquet"), "--out is required without --scenario"),
    (("embed", "--model", "models/toy/gen0"), "say what to embed"),
    (("evaluate", "--scenario", "nope"), "unknown scenario 'nope'"),
    (("evaluate", "--scenario", "toy"), "run the embed stage first"),
    (("simulate-backfill", "--scenario", "toy", "--old", "o", "--variant", "bct"), "is not NAME=VALUE"),
    (("evaluate", "--scenario", "toy", "--params", "missing.yaml"), "missing.yaml"),
])
def test_bad_input_exits_2_with_a_clear_message(runner: CliRunner, project: Path, args: tuple[str, ...],
                                                message: str) -> None:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert "Traceback" not in result.output
