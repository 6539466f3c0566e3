"""The ``modelupgrade`` command: every option explained, the study on tiny data without DVC (the
same files as the stages write), bad input answered with a clear message and exit code 2, and the
parser every command line is derived from (``modelupgrade.cli.arguments``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import pytest
import yaml

from modelupgrade.cli import COMMANDS, command_summary, load_command, main
from modelupgrade.cli.arguments import command_parser, parse_command, run_command
from modelupgrade.config import Params, parse_params
from tests.data_fixtures import write_toy_splits
from tests.model_fixtures import resnet10t

WORKFLOW = ("train", "embed", "evaluate", "simulate-backfill")
PARAMS = {
    "seed": 7,
    "device": "cpu",
    "scenarios": {"toy": {"kind": "extended-data", "strategies": ["independent", "bct"]}},
    "architectures": {
        "default": resnet10t(),
    },
    "training": {"epochs": 1, "batch_size": 16},
    "strategies": {"independent": {"kind": "independent"}, "bct": {"kind": "bct"}},
    "sequential": {"strategies": []},
    "backfill": {"points": 3, "policies": ["random"], "serving_modes": ["mixed"]},
}


@pytest.fixture(autouse=True)
def quiet_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only warnings on stderr, so that what a command prints there is its error alone."""
    monkeypatch.setenv("MODELUPGRADE_LOG_LEVEL", "WARNING")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """params.yaml and a scenario's split files in the pipeline's layout;
    images come from TOY_PIXELS."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    write_toy_splits(tmp_path, monkeypatch)
    return tmp_path


def invoke(capsys: pytest.CaptureFixture, *args: str) -> str:
    """``modelupgrade ARGS``: its standard output; it must succeed (``--help`` exits 0)."""
    try:
        main(list(args))
    except SystemExit as done:
        assert done.code == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_help_lists_the_commands_and_explains_every_option(capsys: pytest.CaptureFixture) -> None:
    listing = invoke(capsys, "--help")
    for name in (
        *WORKFLOW,
        "store-ingest",
        "backfill",
        "search",
        "serve",
        "store-status",
        "promote",
        "lineage",
    ):
        assert name in listing
    for name in WORKFLOW:
        parser = command_parser(load_command(name))
        assert parser.description, f"{name} has no description"
        unexplained = [a.dest for a in parser._actions if not a.help]
        assert not unexplained, f"{name}: options without help: {unexplained}"
        assert "--params" in invoke(capsys, name, "--help")
    assert "(default: params.yaml)" in invoke(capsys, "evaluate", "--help")


def test_the_parser_lists_every_command_with_its_summary(capsys: pytest.CaptureFixture) -> None:
    listing = invoke(capsys, "--help")
    for name in COMMANDS:
        summary = command_summary(name)
        assert summary and summary == load_command(name).__doc__.split("\n")[0]
        assert f"    {name}" in listing and summary.split()[0] in listing
    with pytest.raises(SystemExit) as no_command:
        main([])
    assert no_command.value.code == 2
    with pytest.raises(SystemExit) as unknown:
        main(["nope"])
    assert unknown.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err


def test_the_study_without_dvc_writes_what_the_stages_write(
    capsys: pytest.CaptureFixture, project: Path
) -> None:
    from modelupgrade.evaluation.scenario import evaluate_scenario
    from modelupgrade.layout import StudyLayout

    trained = invoke(capsys, "train", "--scenario", "toy", "--no-progress")
    assert "trained models/toy/gen0" in trained and "final_loss" in trained
    for strategy in ("independent", "bct"):
        invoke(
            capsys,
            "train",
            "--scenario",
            "toy",
            "--generation",
            "1",
            "--strategy",
            strategy,
            "--no-progress",
        )
    # as a reader of the file sees it
    card = json.loads((project / "models/toy/gen1-bct/card.json").read_text())
    assert card["parent"]["path"] == "models/toy/gen0"  # the default --old of generation 1
    assert card["data"]["split"] == "data/splits/toy/new_train.parquet" and card["seed"] == 8

    for model in ("gen0", "gen1-independent", "gen1-bct"):
        written = invoke(capsys, "embed", "--scenario", "toy", "--model", f"models/toy/{model}")
        assert f"embeddings/toy/{model}/gallery.npy" in written
    assert (project / "embeddings/toy/gen1-bct/query.npy").is_file()

    evaluated = invoke(capsys, "evaluate", "--scenario", "toy")
    assert "bct.backward.mAP" in evaluated and "bct.delta_down_pct" in evaluated
    params = parse_params(PARAMS)
    evaluate_scenario(params, "toy", StudyLayout(metrics_root="stage-metrics", plots_root="p"))
    for name in ("summary.json", "cross_model.csv"):
        assert (project / "metrics/toy" / name).read_bytes() == (
            project / "stage-metrics/toy" / name
        ).read_bytes()

    simulated = invoke(capsys, "simulate-backfill", "--scenario", "toy")
    assert "bct.random.mixed.auc_trapezoid.mAP" in simulated
    summary = json.loads((project / "metrics/toy/backfill_summary.json").read_text())
    assert {c["strategy"] for c in summary["curves"]} == {"independent", "bct"}
    assert (project / "plots/toy/backfill_curves.png").is_file()

    explicit = invoke(
        capsys,
        "simulate-backfill",
        "--scenario",
        "toy",
        "--old",
        "embeddings/toy/gen0",
        "--variant",
        "bct=embeddings/toy/gen1-bct",
        "--metrics-dir",
        "explicit",
    )
    assert "1 backfill curves written to explicit" in explicit
    as_json = json.loads(
        invoke(capsys, "embed", "--scenario", "toy", "--model", "models/toy/gen0", "--json")
    )
    # The model's fit to its training images goes beside its embeddings (the evaluation reads it).
    assert as_json == [
        "embeddings/toy/gen0/query.npy",
        "embeddings/toy/gen0/gallery.npy",
        "embeddings/toy/gen0/training_fit.json",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("train", "--scenario", "toy", "--generation", "1", "--strategy", "nope"),
            "unknown strategy 'nope'",
        ),
        (
            ("train", "--split", "data/splits/toy/old_train.parquet"),
            "--out is required without --scenario",
        ),
        (("embed", "--model", "models/toy/gen0"), "say what to embed"),
        (("evaluate", "--scenario", "nope"), "unknown scenario 'nope'"),
        (("evaluate", "--scenario", "toy"), "run the embed stage first"),
        (
            ("simulate-backfill", "--scenario", "toy", "--old", "o", "--variant", "bct"),
            "is not NAME=VALUE",
        ),
        (("evaluate", "--scenario", "toy", "--params", "missing.yaml"), "missing.yaml"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(
    capsys: pytest.CaptureFixture, project: Path, args: tuple[str, ...], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and message in captured.err
    assert "Traceback" not in captured.out + captured.err


# ----- the parser every command line comes from ---------------------------------------------------


def sample(
    params: Params,
    name: str,
    sizes: Sequence[int] = (1, 2),
    mode: Literal["fast", "slow"] = "fast",
    verbose: bool = False,
    out: Path | None = None,
) -> dict:
    """A sample command.

    Args:
        params: the params file
        name: what to call it
        sizes: how big, one or more
        mode: how to run
        verbose: say more
        out: where it goes, a
            second line of help
    """
    return {
        "seed": params.seed,
        "name": name,
        "sizes": list(sizes),
        "mode": mode,
        "verbose": verbose,
        "out": out,
    }


def test_a_list_option_takes_several_values_repeats_and_defaults() -> None:
    arguments, _ = parse_command(sample, ["--name", "a", "--sizes", "3", "4", "--sizes", "5"])
    assert arguments["sizes"] == [3, 4, 5]
    assert parse_command(sample, ["--name", "a"])[0]["sizes"] == (1, 2)
    assert parse_command(sample, ["--name", "a", "--sizes"])[0]["sizes"] == []


def test_a_bool_parameter_is_a_flag_and_its_negation() -> None:
    assert parse_command(sample, ["--name", "a", "--verbose"])[0]["verbose"] is True
    assert parse_command(sample, ["--name", "a", "--no-verbose"])[0]["verbose"] is False
    assert parse_command(sample, ["--name", "a"])[0]["verbose"] is False


def test_a_literal_is_a_choice_and_anything_else_exits_2(capsys: pytest.CaptureFixture) -> None:
    assert parse_command(sample, ["--name", "a", "--mode", "slow"])[0]["mode"] == "slow"
    with pytest.raises(SystemExit) as refused:
        parse_command(sample, ["--name", "a", "--mode", "medium"])
    assert refused.value.code == 2 and "invalid choice: 'medium'" in capsys.readouterr().err


def test_a_missing_required_option_exits_2_naming_it(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as refused:
        parse_command(sample, [])
    assert refused.value.code == 2
    assert "the following arguments are required: --name" in capsys.readouterr().err


def test_help_comes_from_the_docstring() -> None:
    text = command_parser(sample, "sample").format_help()
    assert "A sample command." in text and "where it goes, a second line of help" in text
    assert (
        "(default: fast)" in text and "(default: 1 2)" in text and "(default: params.yaml)" in text
    )


def test_params_are_loaded_checked_and_the_result_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    result = run_command(
        sample, ["--params", str(tmp_path / "params.yaml"), "--name", "x", "--out", "o", "--json"]
    )
    assert result == {
        "seed": 7,
        "name": "x",
        "sizes": [1, 2],
        "mode": "fast",
        "verbose": False,
        "out": Path("o"),
    }
    assert json.loads(capsys.readouterr().out)["out"] == "o"


def test_a_bad_params_file_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bad = tmp_path / "params.yaml"
    bad.write_text("- not\n- a mapping\n")
    with pytest.raises(SystemExit) as refused:
        run_command(sample, ["--params", str(bad), "--name", "x"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad} must hold a mapping") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("command", "request_type"),
    [
        ("modelupgrade.commands.plan:plan", "modelupgrade.commands.plan:PlanRequest"),
        (
            "modelupgrade.commands.store:backfill",
            "modelupgrade.commands.store_backfill:BackfillFlags",
        ),
    ],
)
def test_a_command_s_request_record_has_a_field_for_each_of_its_options(
    command: str, request_type: str
) -> None:
    """``plan`` and ``backfill`` build their typed request from their arguments by name: an option
    added to the command without its field (or a field without its option) is caught here, not
    when a person runs the command."""
    import dataclasses
    import importlib
    import inspect

    def load(reference: str) -> object:
        module, _, name = reference.partition(":")
        return getattr(importlib.import_module(module), name)

    options = [name for name in inspect.signature(load(command)).parameters if name != "params"]
    fields = [field.name for field in dataclasses.fields(load(request_type))]
    assert sorted(options) == sorted(fields)
