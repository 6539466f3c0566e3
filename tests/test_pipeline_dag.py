"""dvc.yaml against params.yaml, and the whole DAG run by `dvc repro` on a tiny configuration."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from modelupgrade.report.claims import CLAIMS
from tests.data_fixtures import write_idx
from tests.processes import run_ok

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_dvc_yaml_has_a_group_for_every_scenario_head_set_and_generation():
    stages = load_yaml(ROOT / "dvc.yaml")["stages"]
    params = load_yaml(ROOT / "params.yaml")
    new_groups = {
        name.removeprefix("train_new_") for name in stages if name.startswith("train_new_")
    }
    assert new_groups == set(params["scenarios"]), (
        "add or remove a train_new_<scenario> group in dvc.yaml"
    )
    for scenario in params["scenarios"]:
        matrix = stages[f"train_new_{scenario}"]["matrix"]
        assert matrix == {
            "scenario": [scenario],
            "strategy": f"${{scenarios.{scenario}.strategies}}",
        }
    chain_heads = {name for name in stages if name.startswith("heads_sequential_gen")}
    head_groups = {
        name.removeprefix("heads_")
        for name in stages
        if name.startswith("heads_") and name not in chain_heads
    }
    assert head_groups == {s for s, v in params["scenarios"].items() if v.get("heads")}
    for scenario in head_groups:
        assert stages[f"heads_{scenario}"]["foreach"] == f"${{scenarios.{scenario}.heads}}"
    # A chain's head at every generation after gen0 (BiCT's recurrent ψ).
    assert chain_heads == {
        f"heads_sequential_gen{i}" for i in range(1, len(params["sequential"]["fractions"]))
    }
    assert all(stages[name]["foreach"] == "${sequential.heads}" for name in chain_heads)
    # One adapter-study stage per scenario of adapters.scenarios, every adapter × size inside it.
    assert stages["adapters"]["foreach"] == "${adapters.scenarios}"
    generations = {
        int(m.group(1))
        for name in stages
        if (m := re.fullmatch(r"train_sequential_gen(\d+)", name))
    }
    assert generations == set(range(len(params["sequential"]["fractions"])))


def tiny_params(dataset_root: Path) -> dict:
    params = load_yaml(ROOT / "params.yaml")
    params["dataset"].update(
        name="tiny-idx", root=str(dataset_root), max_train_per_class=None, min_images_per_class=4
    )
    params["evaluation_split"].update(queries_per_class=4, gallery_per_class=None)
    tiny = {
        "backbone": "resnet10t",
        "backbone_kwargs": {"channels": [8, 8, 8, 8], "stem_width": 8},
        "cifar_stem": False,
        "embedding_dim": 16,
    }
    params["architectures"] = {
        "default": tiny,
        "softmax": {**tiny, "classifier": "softmax"},
        "wide": {**tiny, "backbone_kwargs": {"channels": [16, 16, 16, 16], "stem_width": 16}},
    }
    params["training"].update(steps=16, warmup_steps=2, batch_size=32, cpu_threads=1)
    # The default study's two scenarios (one split by images, one by classes) and the sequential
    # chain; the others train nothing. Every stage of dvc.yaml runs; a third scenario would only
    # run the same stages again (the split of each scenario kind: tests/test_data_scenarios.py).
    params["study"] = {
        "scenarios": ["extended-data", "extended-class"],
        "sequential": ["sequential"],
    }
    for name, scenario in params["scenarios"].items():
        scenario["strategies"] = (
            ["independent", "bct", "dmu"]
            if name == "extended-data"
            else ["independent"]
            if name in params["study"]["scenarios"]
            else []
        )
        scenario.pop("heads", None)
    params["scenarios"]["extended-data"]["heads"] = {
        "fastfill": "independent",
        "rqt": "independent",
    }
    # dvc.yaml has one heads group per scenario that trains heads in params.yaml.
    params["scenarios"]["extended-class"]["heads"] = {"fastfill": "independent"}
    params["strategies"]["dmu"]["options"] = {"head_hidden_dim": 16}
    for head in params["heads"].values():
        head.update(hidden_dim=16, epochs=1)
    params["sequential"]["strategies"] = ["dmu"]
    # The recurrent forward head along the one chain: its stages run at no extra model training.
    params["sequential"]["heads"] = {"dmu": "bict_momentum"}
    # The adapter study on extended-data: two sample sizes (of ~240 pairs), every adapter kind.
    params["adapters"]["sample_sizes"] = [16, "all"]
    # Sixteen steps train nothing to convergence: the gate is opened, so that the claims'
    # plumbing is tested (tests/test_claims.py tests the gate itself).
    params["evaluation"]["convergence"] = {
        "max_loss_ratio": 1e9,
        "min_prototype_accuracy": 0.0,
        "min_classifier_agreement": 0.0,
        "max_collapse": 1.0,
        "min_head_alignment": -1.0,
        "max_late_change": 1e9,
    }
    for name in ("residual_mlp", "residual_mlp_query"):
        params["adapters"]["heads"][name].update(hidden_dim=16, epochs=1)
    # One further seed of a cut-down study: enough for every claim to rest on two seeds' numbers.
    params["replicates"] = {
        "seeds": [1666, 2666],  # side by side, in two worker processes
        "scenarios": {
            "extended-data": {"strategies": ["independent", "bct", "dmu"], "heads": ["fastfill"]},
            "extended-class": {
                "strategies": ["independent"],
                "heads": ["fastfill"],
                "backfill": True,
            },
        },
    }
    return params


def write_learnable_idx_dataset(root: Path, train: int, test: int, classes: int, size: int) -> None:
    """IDX files whose classes differ (a bright square at a class's own place, plus noise): a model
    trained for one epoch spreads them apart, so rankings have no float32 near-ties to break."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    side = size // 2
    for split, count in (("train", train), ("t10k", test)):
        labels = (np.arange(count) % classes).astype(np.uint8)
        images = rng.integers(0, 96, size=(count, size, size)).astype(np.uint8)
        for i, label in enumerate(labels):
            row, col = divmod(int(label), 2)
            images[i, row * side : (row + 1) * side, col * side : (col + 1) * side] += 150
        write_idx(root / f"{split}-images-idx3-ubyte.gz", images)
        write_idx(root / f"{split}-labels-idx1-ubyte.gz", labels)


def dvc(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}",
        "PYTHONPATH": str(project),
    }
    # About 3x the first repro's time on a quiet 2-core machine (~6 min beside the rest of the
    # suite): a slower or busier machine still finishes it.
    return run_ok([str(BIN / "dvc"), *args], project, env, timeout=1200)


def ran_stages(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


def assert_backfill_end_points_equal_cross_model_entries(metrics: Path) -> None:
    """A curve starts at the state where nothing is backfilled and ends where everything is: both
    states are single-system searches the evaluate stage measured independently."""
    import pandas as pd

    table = pd.read_parquet(metrics / "cross_model.parquet")
    summary = json.loads((metrics / "backfill_summary.json").read_text())

    def matrix(query: str, gallery: str, metric: str) -> float:
        rows = table[
            (table.query_set == query) & (table.gallery_set == gallery) & (table.metric == metric)
        ]
        return float(rows.value.iloc[0])

    # (system, serving mode) -> (query, gallery) pairs of the evaluate stage at t = 0 and t = 1
    expected = {
        ("bct", "mixed"): (("gen1-bct", "gen0"), ("gen1-bct", "gen1-bct")),
        ("independent", "rank-merge"): (("gen0", "gen0"), ("gen1-independent", "gen1-independent")),
        ("fastfill-independent", "mixed"): (
            ("gen1-independent", "fastfill-independent(gen0)"),
            ("gen1-independent", "gen1-independent"),
        ),
    }
    checked = 0
    for curve in summary["curves"]:
        pairs = expected.get((curve["strategy"], curve["mode"]))
        if pairs is None:
            continue
        for point, (query, gallery) in zip(("start", "end"), pairs):
            for metric in ("top1", "mAP"):
                assert curve[point][metric] == pytest.approx(
                    matrix(query, gallery, metric), abs=1e-6
                ), (curve["strategy"], curve["mode"], point, metric)
        checked += 1
    assert checked >= 3 * 4  # every policy of each listed (system, mode)


@pytest.mark.timeout(1800)
def test_whole_dag_on_a_tiny_configuration(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("modelupgrade", "stages"):
        shutil.copytree(ROOT / package, project / package, ignore=ignore)
    shutil.copy(ROOT / "dvc.yaml", project / "dvc.yaml")
    # The report reads the GPU-scale study's folder (here as committed: no run yet).
    shutil.copytree(ROOT / "results" / "gpu-quick", project / "results" / "gpu-quick")
    write_learnable_idx_dataset(tmp_path / "idx", train=240, test=96, classes=4, size=16)
    (project / "params.yaml").write_text(
        yaml.safe_dump(tiny_params(tmp_path / "idx"), sort_keys=False)
    )
    dvc(project, "init", "--no-scm", "-q")
    # The project's own: the interpreter's __pycache__ is not code the closures stage reads.
    shutil.copy(ROOT / ".dvcignore", project / ".dvcignore")

    first = dvc(project, "repro")
    expected = set(dvc(project, "stage", "list", "--name-only").stdout.split())
    assert ran_stages(first.stdout) == expected
    report = (project / "reports" / "study" / "report.md").read_text(encoding="utf-8")
    assert "Do the papers' claims hold here?" in report
    for scenario in ("extended-data", "extended-class"):
        assert f"Scenario {scenario}" in report
    assert "Scenario open-class" not in report  # defined, but not in study.scenarios
    assert (project / "reports" / "study" / "report.html").is_file()
    claims = json.loads((project / "reports" / "study" / "claims.json").read_text())
    assert len(claims) == len(CLAIMS)
    # Each measured check weighs the three seeds' numbers, the study's and two replicates': a seed
    # where the check's premise fails in this toy (a BCT model not backward compatible, an old
    # model not comparable to the new one) is left out of it, and counted as left out.
    tested = [c for c in claims if not c["verdict"].startswith("not tested")]
    seeds = {c["statement"][:40]: c["seeds"] for c in tested}
    assert seeds and 3 in set(seeds.values()), seeds
    assert all(
        check["seeds"] + check["seeds_left_out"] == 3 for c in tested for check in c["checks"]
    )
    assert "Across training seeds" in report
    assert "## At GPU scale" in report and "has not been run" in report
    assert sorted(p.name for p in (project / "replicates").iterdir()) == [
        "seed-1666",
        "seed-2666",
        "seeds.json",
    ]
    assert "Training-free adapters (extended-data)" in report
    assert "up to date" in dvc(project, "status").stdout
    assert_backfill_end_points_equal_cross_model_entries(project / "metrics" / "extended-data")
    chain = json.loads((project / "metrics/sequential/dmu/summary.json").read_text())
    refreshes = chain["refreshes"]["mAP"]
    assert [(r["current_gallery"], r["refreshed_gallery"]) for r in refreshes] == [
        ("gen0", "gen1-psi"),
        ("gen1-psi", "gen2-psi"),
    ]
    assert all(0 <= r["on_current"] <= 1 and 0 <= r["on_refreshed"] <= 1 for r in refreshes)
    assert "The gallery along each chain" in report

    # One strategy's λ changes: only that strategy's model and what reads it run again.
    params = load_yaml(project / "params.yaml")
    params["strategies"]["bct"]["options"] = {"weight": 0.5}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    second = dvc(project, "repro")
    assert ran_stages(second.stdout) == {
        "train_new_extended-data@extended-data-bct",
        "evaluate@extended-data",
        "simulate_backfill@extended-data",
        "register@extended-data",
        "replicates",  # one stage for every seed's models: any training change runs it again
        "report",
    }
    assert "up to date" in dvc(project, "status").stdout

    # A change to code only the report runs: the closures are written again and, of the study,
    # only the report runs (its closure file changed; every other stage's is as it was).
    command = project / "modelupgrade" / "commands" / "report.py"
    command.write_text(command.read_text(encoding="utf-8") + "\n# changed\n", encoding="utf-8")
    third = dvc(project, "repro")
    assert ran_stages(third.stdout) == {"closures", "report"}
