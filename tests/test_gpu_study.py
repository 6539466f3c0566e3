"""The GPU study (``modelupgrade gpu-study``): the runner a lent GPU machine runs in one command.

The end-to-end test runs it as that machine would, on the CPU at the rehearsal's tiny size
(params/gpu-quick.yaml + params/gpu-rehearsal.yaml): in a fresh interpreter where only the GPU
machine's packages can be imported (scripts/gpu_machine/sitecustomize.py), so that an import of
DVC, MLflow, Prefect, FAISS or Great Expectations on its path fails here before it fails there.
The report's section "At GPU scale" is rendered from what it wrote. The time-limit tests replace
the seed's work with a stand-in: they are about when a seed starts and what is kept when one stops.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from modelupgrade import gpu_study
from modelupgrade.config import Params
from modelupgrade.gpu_study import (
    RUN_FILE,
    GpuStudyRun,
    gpu_study_params,
    next_seed_fits,
    run_gpu_study,
)
from modelupgrade.layout import (
    BACKFILL_PER_QUERY_FILE,
    BACKFILL_SUMMARY_FILE,
    PER_QUERY_AP_FILE,
    SUMMARY,
)
from modelupgrade.report import write_report
from modelupgrade.report.claims import CLAIMS
from modelupgrade.report.document import render_markdown
from modelupgrade.report.gpu_scale import collect_gpu_scale, gpu_scale_blocks

ROOT = Path(__file__).resolve().parent.parent
OVERLAYS = [ROOT / "params" / "gpu-quick.yaml", ROOT / "params" / "gpu-rehearsal.yaml"]
DATASET = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
SCENARIOS = ("extended-data", "extended-class")
# A Python repr in the rendered report (``Claim(``, ``SeededCheck(``): never shown to a person.
REPR = re.compile(r"\b[A-Z][A-Za-z]+\(")


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runner's results at the rehearsal size, run as the device command runs it."""
    if not DATASET.is_file():
        pytest.skip("Fashion-MNIST is not installed (make dataset)")
    out = tmp_path_factory.mktemp("gpu") / "gpu-quick"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "scripts" / "gpu_machine"), str(ROOT)]),
        "MODELUPGRADE_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "modelupgrade", "gpu-study", "--overlay", *map(str, OVERLAYS)]
        + ["--out", str(out), "--time-limit", "300", "--json"],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_gpu_profile_trains_resnet18_on_what_the_claims_rest_on() -> None:
    from modelupgrade.models import EmbeddingModel

    quick = gpu_study_params(ROOT / "params.yaml", OVERLAYS[:1])
    cpu = gpu_study_params(ROOT / "params.yaml", [])
    architecture = quick.architectures["default"]
    model = EmbeddingModel(architecture, in_chans=1, num_classes=10, input_size=28)
    # ResNet-18's own widths (11.2 M parameters), not the CPU network's quarter widths.
    assert architecture.backbone == "resnet18" and architecture.embedding_dim == 128
    assert 11_000_000 < sum(p.numel() for p in model.backbone.parameters()) < 11_500_000
    assert (quick.training.steps, quick.training.batch_size) == (250, 512)
    assert quick.dataset.max_train_per_class == 3000 and quick.device == "auto"
    assert len(gpu_study.study_seeds(quick)) == 5
    # What the claims rest on at five seeds: the CPU study's five-seed overlay (params.yaml itself
    # trains three seeds, without DMU on extended-class and BiCT, within make repro's budget).
    five = gpu_study_params(ROOT / "params.yaml", [ROOT / "params" / "five-seeds.yaml"])
    assert quick.replicates == five.replicates
    assert {n: s.strategies for n, s in quick.scenarios.items()} == {
        n: s.strategies for n, s in five.scenarios.items()
    }
    assert quick.adapters.scenarios == cpu.adapters.scenarios
    # The rehearsal shrinks the sizes and keeps what runs.
    rehearsal = gpu_study_params(ROOT / "params.yaml", OVERLAYS)
    assert rehearsal.replicates.scenarios == quick.replicates.scenarios
    assert rehearsal.scenarios == quick.scenarios


def test_the_run_writes_each_seeds_metrics_and_its_record(gpu_run: Path) -> None:
    record = json.loads((gpu_run / RUN_FILE).read_text())
    params = gpu_study_params(ROOT / "params.yaml", OVERLAYS)
    assert record["state"] == "finished"
    assert record["seeds_planned"] == record["seeds_finished"] == [666, 1666]
    assert record["failed"] == {}
    assert record["device"].startswith("cpu")
    assert {"torch", "cuda", "python"} <= set(record["versions"])
    assert 0 < record["wall_seconds"] <= record["time_limit_seconds"]
    for seed in record["seeds"]:
        models = {(m["scenario"], m["model"]) for m in seed["models"]}
        assert models == {
            *((s, m) for s in SCENARIOS for m in ("gen0", "gen1-independent", "gen1-bct")),
            *((s, "gen1-dmu") for s in SCENARIOS),
            ("extended-data", "gen1-bict"),
        }
        assert all(m["train_seconds"] > 0 and m["images_per_second"] > 0 for m in seed["models"])
        assert all(m["steps"] == 3 for m in seed["models"])
        # One entry per head the profile trains, every scenario's (FCT on both, FastFill, ...).
        assert len(seed["heads"]) == sum(len(s.heads) for s in params.scenarios.values()) >= 7
        metrics = gpu_run / f"seed-{seed['seed']}" / "metrics"
        for scenario in SCENARIOS:
            summary = json.loads((metrics / scenario / f"{SUMMARY}.json").read_text())
            assert {"gen0", "gen1-independent", "gen1-bct"} <= set(summary["convergence"])
            assert (metrics / scenario / PER_QUERY_AP_FILE).is_file()
        # The backfill claims rest on extended-class's simulation (replicates.scenarios).
        assert (metrics / "extended-class" / BACKFILL_SUMMARY_FILE).is_file()
        assert (metrics / "extended-class" / BACKFILL_PER_QUERY_FILE).is_file()
    # The params it ran with, read back as they were; no scratch is left.
    written = yaml.safe_load((gpu_run / "params.yaml").read_text())
    assert written == params.model_dump(mode="json")
    assert sorted(p.name for p in gpu_run.iterdir()) == [
        "params.yaml",
        RUN_FILE,
        "seed-1666",
        "seed-666",
    ]


def test_the_report_sets_the_gpu_run_beside_the_cpu_study(gpu_run: Path) -> None:
    gpu = collect_gpu_scale(gpu_run)
    assert gpu is not None and len(gpu.seeds) == 2 and len(gpu.claims) == len(CLAIMS)
    # The CPU side: here the same results, so every verdict must agree.
    text = render_markdown("r", gpu_scale_blocks(gpu.seeds, gpu.claims, gpu_run))
    assert "## At GPU scale" in text
    assert "seeds 666, 1666 of 666, 1666 finished (finished)" in text
    assert "Every claim's verdict is the same at both scales." in text
    olds = [sc.evaluation.old_self for study in gpu.seeds for sc in study.scenarios[:1]]
    mean = sum(olds) / 2
    assert f"| extended-data | mAP | {mean:.3f} ± " in text
    for i, claim in enumerate(gpu.claims, 1):
        assert f"{i}. {claim.statement}" in text
    assert not REPR.search(text), REPR.search(text)
    # A CPU verdict that differs is named.
    changed = [dataclasses.replace(gpu.claims[0], verdict="fails"), *gpu.claims[1:]]
    text = render_markdown("r", gpu_scale_blocks(gpu.seeds, changed, gpu_run))
    gpu_verdict = gpu.claims[0].verdict.split(" (")[0]
    assert f"disagree on claim 1 (fails on the CPU, {gpu_verdict} on the GPU)" in text


def test_the_study_report_has_the_section_from_results_gpu_quick(
    gpu_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = collect_gpu_scale(gpu_run)
    assert gpu is not None
    monkeypatch.setattr("modelupgrade.report.gpu_scale.GPU_RESULTS", gpu_run)
    write_report(gpu.seeds[0], {}, {}, tmp_path / "with", replicates=gpu.seeds[1:])
    report = (tmp_path / "with" / "report.md").read_text()
    assert "## At GPU scale" in report and "verdict GPU" in report
    monkeypatch.setattr("modelupgrade.report.gpu_scale.GPU_RESULTS", tmp_path / "none")
    write_report(gpu.seeds[0], {}, {}, tmp_path / "without", replicates=gpu.seeds[1:])
    report = (tmp_path / "without" / "report.md").read_text()
    assert "The GPU-scale study has not been run" in report
    assert "verdict GPU" not in report


# -- the time limit --------------------------------------------------------------------------------


def test_a_seed_starts_only_where_the_longest_so_far_still_fits() -> None:
    assert next_seed_fits(elapsed=10, limit=300, durations=[])
    assert not next_seed_fits(elapsed=300, limit=300, durations=[])
    assert next_seed_fits(elapsed=100, limit=300, durations=[80, 100])  # 100 + 115 < 300
    assert not next_seed_fits(elapsed=190, limit=300, durations=[80, 100])  # 190 + 115 > 300


@pytest.fixture
def stand_in_seeds(monkeypatch: pytest.MonkeyPatch) -> dict[int, str]:
    """Each seed's work replaced: a seed marked "fails" raises, "stops" reaches the time limit
    while under way (its scratch half-written), any other finishes at once."""
    behaviour: dict[int, str] = {}

    def run_replicate(params, seed, root, splits_root, on_finished=None):
        scratch = root / f".seed-{seed}.partial"
        scratch.mkdir(parents=True)
        if behaviour.get(seed) == "fails":
            raise RuntimeError("a stand-in failure")
        if behaviour.get(seed) == "stops":
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            time.sleep(10)
        (root / f"seed-{seed}" / "metrics").mkdir(parents=True)
        scratch.rmdir()
        on_finished(params, None)
        return root / f"seed-{seed}"

    monkeypatch.setattr(gpu_study, "run_replicate", run_replicate)
    monkeypatch.setattr(gpu_study, "write_study_splits", lambda params, root: root.mkdir())
    monkeypatch.setattr(gpu_study, "trained_on", lambda params, layout: ([], []))
    return behaviour


def seeds_params(seeds: list[int]) -> Params:
    """The rehearsal's params with these replicate seeds."""
    params = gpu_study_params(ROOT / "params.yaml", OVERLAYS)
    replicates = params.replicates.model_copy(update={"seeds": seeds})
    return params.model_copy(update={"replicates": replicates})


def test_at_the_time_limit_the_run_stops_and_keeps_the_seeds_that_finished(
    tmp_path: Path, stand_in_seeds: dict[int, str]
) -> None:
    stand_in_seeds[1666] = "stops"
    record = run_gpu_study(seeds_params([1666, 2666]), tmp_path, time_limit=60)
    assert record.seeds_finished == [666]
    assert record.state == "stopped at the time limit (60 s) during seed 1666"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml", RUN_FILE, "seed-666"]
    assert GpuStudyRun.read(tmp_path / RUN_FILE).as_dict() == record.as_dict()


def test_a_seed_that_would_not_end_in_time_does_not_start(
    tmp_path: Path, stand_in_seeds: dict[int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        gpu_study, "next_seed_fits", lambda elapsed, limit, durations: not durations
    )
    record = run_gpu_study(seeds_params([1666]), tmp_path, time_limit=60)
    assert record.seeds_finished == [666]
    assert record.state.startswith("stopped before seed 1666")
    assert record.exit_code == 0


def test_a_failed_seed_is_recorded_and_the_next_one_runs(
    tmp_path: Path, stand_in_seeds: dict[int, str]
) -> None:
    stand_in_seeds[666] = "fails"
    (tmp_path / "seed-4666").mkdir()  # a previous run's: removed
    record = run_gpu_study(seeds_params([1666]), tmp_path, time_limit=60)
    assert record.seeds_finished == [1666]
    assert record.failed == {"666": "RuntimeError: a stand-in failure"}
    assert record.state == "finished, 1 seed failed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml", RUN_FILE, "seed-1666"]


def test_no_seed_finished_is_a_failed_run(tmp_path: Path, stand_in_seeds: dict[int, str]) -> None:
    stand_in_seeds[666] = "stops"
    record = run_gpu_study(seeds_params([]), tmp_path, time_limit=60)
    assert record.seeds_finished == [] and record.exit_code == 1
    assert "no seed of [666] finished" in record.exit_message
    text = render_markdown("r", gpu_scale_blocks([], [], tmp_path))
    assert "no seed finished" in text
