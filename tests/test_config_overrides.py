"""params overlays (params/gpu-full.yaml) as `dvc exp run -S` overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from modelupgrade.config import ParamsError, parse_params
from modelupgrade.overrides import experiment_commands, merge, read_overlay, set_arguments

ROOT = Path(__file__).resolve().parents[1]


def test_leaves_become_set_arguments_and_lists_or_empty_mappings_are_set_whole():
    overlay = {
        "training": {"epochs": 30, "crop_scale": [0.5, 1.0]},
        "architectures": {"wide": {"backbone_kwargs": {}}},
        "dataset": {"max_train_per_class": None},
    }
    assert set_arguments(overlay) == [
        "-S",
        "training.epochs=30",
        "-S",
        "training.crop_scale=[0.5,1.0]",
        "-S",
        "architectures.wide.backbone_kwargs={}",
        "-S",
        "dataset.max_train_per_class=null",
    ]


def test_one_queued_experiment_per_seed_then_the_queue_runs():
    commands = experiment_commands({"training": {"epochs": 2}}, [0, 1])
    assert commands[0][-2:] == ["-S", "seed=0"] and commands[1][-2:] == ["-S", "seed=1"]
    assert all(c[:4] == ["dvc", "exp", "run", "--queue"] for c in commands[:2])
    assert commands[-1] == ["dvc", "queue", "start"]


def test_the_gpu_overlay_merges_into_a_valid_configuration():
    overlay = read_overlay(ROOT / "params" / "gpu-full.yaml", ROOT / "params.yaml")
    merged = merge(yaml.safe_load((ROOT / "params.yaml").read_text()), overlay)
    assert merged["architectures"]["default"]["backbone"] == "resnet18"
    # ResNet-18's own widths: the overlay's empty backbone_kwargs replaces the CPU network's, as
    # `dvc exp run -S architectures.default.backbone_kwargs={}` does.
    assert merged["architectures"]["default"]["backbone_kwargs"] == {}
    # the paper's default, not the CPU study's 256
    assert merged["heads"]["bict"]["hidden_dim"] is None
    scenarios = yaml.safe_load((ROOT / "params.yaml").read_text())["scenarios"]
    # Every scenario runs; identical-data as UniBCT's ResNet-18 → ResNet-50 instead of the CPU
    # study's softmax → ArcFace; the open scenarios, and extended-class with DMU too, train the
    # compatible strategies.
    scenarios["identical-data"].update(
        old_architecture="default", new_architecture="wide", strategies=["independent"]
    )
    for name in ("extended-class", "open-data", "open-class"):
        scenarios[name]["strategies"] = ["independent", "bct", "dmu"]
    scenarios["extended-data"]["strategies"].append("bict")
    scenarios["extended-data"]["heads"]["bict"] = "bict"
    assert merged["scenarios"] == scenarios
    assert sorted(merged["study"]["scenarios"]) == sorted(scenarios)
    assert merged["training"]["steps"] is None and merged["training"]["epochs"] == 30
    assert merged["architectures"]["wide"]["backbone"] == "resnet50"
    assert 'scenarios.identical-data.new_architecture="wide"' in set_arguments(overlay)


def test_the_full_cpu_overlay_runs_every_scenario_strategy_head_and_chain():
    overlay = read_overlay(ROOT / "params" / "full-cpu.yaml", ROOT / "params.yaml")
    merged = merge(yaml.safe_load((ROOT / "params.yaml").read_text()), overlay)
    assert sorted(merged["study"]["scenarios"]) == sorted(merged["scenarios"])
    assert merged["study"]["sequential"] == ["sequential"]
    assert set(merged["scenarios"]["extended-data"]["strategies"]) >= {
        "regression",
        "focal",
        "lce",
        "unibct",
        "ract",
    }
    assert {"rqt", "mcl", "rm_full", "fct"} <= set(merged["scenarios"]["extended-data"]["heads"])
    assert all(scenario["strategies"] for scenario in merged["scenarios"].values())
    assert (
        merged["sequential"]["strategies"]
        and "rank-merge-rqt" in (merged["backfill"]["serving_modes"])
    )


def test_an_overlay_with_an_unknown_key_is_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  epoch: 3\n")
    with pytest.raises(ParamsError, match="training.epoch: unknown key"):
        read_overlay(bad, ROOT / "params.yaml")


def test_an_overlay_naming_an_unknown_plugin_is_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("store:\n  policy: oracle\nstrategies:\n  bct:\n    options:\n      weigth: 2\n")
    with pytest.raises(ParamsError) as err:
        read_overlay(bad, ROOT / "params.yaml")
    assert "(2 problem(s))" in str(err.value)
    assert "store.policy: backfill ordering policy 'oracle' is not deployable" in str(err.value)
    assert "strategies.bct.options.weigth: unknown key" in str(err.value)


def test_the_experiments_command_prints_the_queue_it_would_run(capsys, monkeypatch):
    from modelupgrade.cli import main

    monkeypatch.setenv("MODELUPGRADE_LOG_LEVEL", "WARNING")
    monkeypatch.chdir(ROOT)
    main(["experiments", "--overlay", "params/gpu-full.yaml", "--seeds", "0", "1", "--dry-run"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" -S ")[0] for line in lines] == ["dvc exp run --queue"] * 2 + [
        "dvc queue start"
    ]
    assert lines[0].endswith("-S seed=0") and lines[1].endswith("-S seed=1")
    assert '-S architectures.default.backbone="resnet18"' in lines[0]


def test_a_key_the_params_lack_is_added_with_hydras_plus_and_one_they_hold_is_set():
    base = {"training": {"epochs": 6}, "adopted": {}}
    overlay = {"training": {"epochs": 2, "lr": 0.1}, "adopted": {"mine": {"kind": "timm"}}}
    assert set_arguments(overlay, base=base) == [
        "-S", "training.epochs=2",
        "-S", "+training.lr=0.1",
        "-S", '+adopted.mine.kind="timm"',
    ]  # fmt: skip
    assert experiment_commands(overlay, [], base, ["upgrade"])[0][-1] == "upgrade"


def test_the_your_upgrade_profile_is_a_valid_overlay_naming_its_models_and_inputs():
    overlay = yaml.safe_load((ROOT / "params" / "your-upgrade.yaml").read_text())
    params = parse_params(merge(yaml.safe_load((ROOT / "params.yaml").read_text()), overlay), "x")
    upgrade = params.upgrades["mine"]
    assert {upgrade.old, upgrade.new} <= set(params.adopted)
    for name in (upgrade.old, upgrade.new):
        assert params.adopted[name].options["path"].startswith(upgrade.inputs + "/")
    assert all(path.startswith(upgrade.inputs + "/") for path in upgrade.files().values())
