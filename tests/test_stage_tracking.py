"""Every stage as a child run in MLflow: params, headline metrics and report artifacts, one parent
per pipeline execution, the same outputs as without tracking, and failures recorded as FAILED."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import yaml

from modelupgrade.config import Params, parse_params
from modelupgrade.errors import UserError
from modelupgrade.registry import PARENT_RUN_ENV, StageLog, StageRecord, Tracker
from modelupgrade.registry.spool import spool_record
from tests.processes import run_ok
from tests.registry_support import fresh_tracker, make_template
from tests.test_evaluation import _write_scenario

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_template(tmp_path_factory.mktemp("template"))


@pytest.fixture
def store(template_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Tracker:
    """A fresh file store that the stages find through MLFLOW_TRACKING_URI, as under DVC."""
    tracker = fresh_tracker(template_db, tmp_path / "store")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracker.config.tracking_uri)
    monkeypatch.setenv(PARENT_RUN_ENV, "")  # restored (unset) after the test
    return tracker


def scenario_params(tracker: Tracker) -> Params:
    """A two-model scenario ``sc`` that logs to ``tracker``'s store."""
    return parse_params(
        {
            "scenarios": {"sc": {"kind": "extended-data", "strategies": ["independent", "bct"]}},
            "architectures": {"default": {}},
            "strategies": {"independent": {"kind": "independent"}, "bct": {"kind": "bct"}},
            "sequential": {"strategies": []},
            "backfill": {"points": 3, "policies": ["random"], "serving_modes": ["mixed"]},
            "registry": {"experiment": "test", "artifact_root": str(tracker.config.artifact_root)},
        }
    )


@pytest.fixture
def scenario(store: Tracker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Params:
    """The scenario's splits and embeddings in the pipeline's layout, in the working directory."""
    monkeypatch.chdir(tmp_path)
    _write_scenario(tmp_path)
    return scenario_params(store)


def runs_by_stage(tracker: Tracker) -> dict[str, list]:
    found: dict[str, list] = {}
    for run in tracker.client.search_runs([tracker.experiment_id]):
        found.setdefault(run.data.tags.get("stage_kind", "parent"), []).append(run)
    return found


def artifact_paths(tracker: Tracker, run_id: str, folder: str) -> set[str]:
    return {a.path for a in tracker.client.list_artifacts(run_id, folder)}


def test_evaluate_and_backfill_stages_log_child_runs_under_one_parent(
    store: Tracker, scenario: Params
) -> None:
    from modelupgrade.commands.backfill import simulate_backfill
    from modelupgrade.commands.evaluation import evaluate

    summary = evaluate(scenario, "sc").summary
    backfill = simulate_backfill(
        scenario, "sc", old=Path("embeddings/sc/gen0"), variant=["bct=embeddings/sc/gen1-bct"]
    ).summary

    runs = runs_by_stage(store)
    (evaluated,), (simulated,), (parent,) = (
        runs["evaluate"],
        runs["simulate_backfill"],
        runs["parent"],
    )
    assert (
        evaluated.data.tags["mlflow.parentRunId"]
        == simulated.data.tags["mlflow.parentRunId"]
        == parent.info.run_id
    )
    assert {"git_commit", "dvc_data_hash", "params_hash", "user"} <= set(parent.data.tags)
    assert evaluated.info.run_name == evaluated.data.tags["stage"] == "evaluate@sc"
    assert evaluated.info.status == "FINISHED" and evaluated.data.tags["scenario"] == "sc"

    assert evaluated.data.params["evaluation.headline_metric"] == "mAP"
    assert evaluated.data.params["scenario.strategies"] == "['independent', 'bct']"
    assert evaluated.data.params["args.scenario"] == "sc"
    metrics = evaluated.data.metrics
    backward = summary.row("bct", "backward")
    assert metrics["bct.backward.mAP"] == pytest.approx(backward.value)
    assert metrics["bct.backward.delta_up_pct"] == pytest.approx(backward.delta_up_pct)
    assert metrics["bct.backward.negative_flip_rate"] == pytest.approx(backward.negative_flip_rate)
    assert metrics["bct.delta_down_pct"] == pytest.approx(backward.delta_down_pct)
    assert metrics["old_self.mAP"] == pytest.approx(summary.old_self)
    # NaN: Δ↑ of a model against itself does not apply
    assert "bct.self.delta_up_pct" not in metrics
    assert artifact_paths(store, evaluated.info.run_id, "evaluation") == {
        f"evaluation/{name}"
        for name in ("summary.json", "summary.csv", "cross_model.csv", "cross_model_heatmap.png")
    }

    assert simulated.data.params["backfill.points"] == "3"
    assert simulated.data.params["args.variants.bct"] == "embeddings/sc/gen1-bct"
    curve = backfill.curves[0]
    assert simulated.data.metrics["bct.random.mixed.auc_trapezoid.mAP"] == pytest.approx(
        curve.auc_trapezoid["mAP"]
    )
    assert artifact_paths(store, simulated.info.run_id, "backfill") == {
        "backfill/backfill_summary.json",
        "backfill/backfill_curves.csv",
        "backfill/backfill_curves.png",
    }


def test_tracking_leaves_the_outputs_as_the_library_writes_them(
    scenario: Params, tmp_path: Path
) -> None:
    from modelupgrade.commands.evaluation import evaluate
    from modelupgrade.evaluation.scenario import evaluate_scenario
    from modelupgrade.layout import StudyLayout

    evaluate(scenario, "sc")
    evaluate_scenario(
        scenario, "sc", StudyLayout(metrics_root="untracked", plots_root="untracked-plots")
    )
    for name in ("summary.json", "cross_model.csv", "cross_model.json", "summary.csv"):
        assert (tmp_path / "metrics/sc" / name).read_bytes() == (
            tmp_path / "untracked/sc" / name
        ).read_bytes()
    assert sorted(p.name for p in (tmp_path / "metrics/sc").iterdir()) == sorted(
        p.name for p in (tmp_path / "untracked/sc").iterdir()
    )


def test_a_failing_stage_is_a_failed_run_that_names_the_error(
    store: Tracker, scenario: Params, tmp_path: Path
) -> None:
    from modelupgrade.commands.evaluation import evaluate

    (tmp_path / "embeddings/sc/gen1-bct/query.npy").unlink()
    with pytest.raises(UserError, match="run the embed stage first"):
        evaluate(scenario, "sc")
    (failed,) = runs_by_stage(store)["evaluate"]
    assert failed.info.status == "FAILED"
    assert "gen1-bct query embeddings" in failed.data.tags["error"]
    assert failed.data.params["evaluation.headline_metric"] == "mAP"


def test_a_spooled_record_is_written_with_its_artifacts_as_they_were(
    store: Tracker, tmp_path: Path
) -> None:
    """A stage without MLflow loaded leaves its record in the spool; any tracker
    that opens writes it."""
    report = tmp_path / "report.md"
    report.write_text("# as the stage wrote it\n")
    record = StageRecord("validate", "validate", "process:1:1", params_hash="abc")
    record.log_params({"dataset": {"name": "tiny"}})
    record.log_metrics({"tiny.failed": 0, "mAP@10": 0.5})
    record.log_artifact(report, "validation")
    record.end("FINISHED")
    spooled = spool_record(record, store.config)
    report.write_text("# changed by a later stage\n")

    assert Tracker(store.config).write_pending_stages() == 0  # opening the tracker wrote it already
    assert not spooled.exists() and not spooled.with_suffix("").exists()
    (run,) = runs_by_stage(store)["validate"]
    assert run.data.params == {"dataset.name": "tiny"} and run.data.metrics == {
        "tiny.failed": 0.0,
        "mAP_10": 0.5,
    }
    assert run.info.start_time == record.started_ms and run.info.end_time == record.ended_ms
    parent = store.client.get_run(run.data.tags["mlflow.parentRunId"])
    assert parent.data.tags["params_hash"] == "abc"
    local = store.client.download_artifacts(
        run.info.run_id, "validation/report.md", str(tmp_path / "download")
    )
    assert Path(local).read_text() == "# as the stage wrote it\n"


def test_a_stage_process_spools_its_run_and_a_writer_process_writes_it(
    store: Tracker, tmp_path: Path
) -> None:
    """``python -m stages.evaluate`` as DVC runs it: the stage never loads MLflow and does not wait
    for it; the writer process it leaves behind writes the run under the orchestrator's parent."""
    _write_scenario(tmp_path)
    params = scenario_params(store)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json")))
    parent = store.start_pipeline_run("prefect-flow")
    env = {**os.environ, "PYTHONPATH": str(ROOT), PARENT_RUN_ENV: parent}
    probe = (
        "import runpy, sys; runpy.run_module('stages.evaluate', run_name='__main__'); "
        "print('mlflow' in sys.modules)"
    )
    args = [sys.executable, "-c", probe, "--params", "params.yaml", "--scenario", "sc"]
    done = run_ok(args, tmp_path, env)
    # The stage prints what it did, then the probe whether the stage process ever imported MLflow.
    assert "sc: evaluation written to metrics/sc" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "False"

    spool = store.config.spool_dir
    deadline = time.monotonic() + 300
    while list(spool.glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not list(spool.glob("*.json")), (spool / "writer.log").read_text()
    (evaluated,) = runs_by_stage(store)["evaluate"]
    assert evaluated.data.tags["mlflow.parentRunId"] == parent
    assert (
        evaluated.info.status == "FINISHED" and evaluated.info.end_time >= evaluated.info.start_time
    )
    summary = json.loads((tmp_path / "metrics/sc/summary.json").read_text())
    assert evaluated.data.metrics["old_self.mAP"] == pytest.approx(summary["old_self"])
    assert "evaluation/summary.json" in artifact_paths(store, evaluated.info.run_id, "evaluation")


def test_a_live_run_and_a_stage_record_log_the_same_run(store: Tracker, tmp_path: Path) -> None:
    """``StageLog`` is one interface: the same calls give the same run, live or from a record."""
    report = tmp_path / "report.md"
    report.write_text("# report\n")

    def log(stage: StageLog) -> None:
        stage.log_params({"training": {"lr": 0.1, "schedule": None}, "name": "x"})
        stage.log_metrics(
            {"mAP@10": 0.5, "nan": float("nan"), "inf": float("inf"), "note": "text", "flag": True}
        )
        stage.set_tags({"scenario": "sc"})
        stage.log_artifacts([report], "reports")
        stage.log_dict({"lineage": ["v1", "v2"]}, "registry/lineage.json")

    with store.stage_run("live") as live:
        log(live)
    record = StageRecord("spooled", "spooled", "process:1:1")
    log(record)
    record.end("FINISHED")
    spool_record(record, store.config)
    Tracker(store.config)  # opening a tracker writes the spooled record
    (spooled,) = runs_by_stage(store)["spooled"]
    runs = {"live": store.client.get_run(live.run_id), "spooled": spooled}
    for name, run in runs.items():
        assert run.data.params == {"training.lr": "0.1", "name": "x"}, name
        assert run.data.metrics == {"mAP_10": 0.5}, name
        assert run.data.tags["scenario"] == "sc", name
        assert artifact_paths(store, run.info.run_id, "reports") == {"reports/report.md"}, name
        local = tmp_path / name
        lineage = store.client.download_artifacts(
            run.info.run_id, "registry/lineage.json", str(local)
        )
        assert json.loads(Path(lineage).read_text()) == {"lineage": ["v1", "v2"]}, name


def test_one_lingering_writer_writes_the_records_of_the_stages_that_follow(
    store: Tracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipeline's stages end seconds apart: the writer that loaded MLflow for the first record
    stays and writes the next ones; a writer started meanwhile leaves its record to it."""
    import threading

    from modelupgrade.registry import spool_writer

    opened: list[Tracker] = []

    class CountingTracker(Tracker):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(spool_writer, "Tracker", CountingTracker)
    monkeypatch.setattr(spool_writer, "POLL_S", 0.05)

    def spool(name: str) -> Path:
        record = StageRecord(name, name, "process:1:1")
        record.end("FINISHED")
        return spool_record(record, store.config)

    first = spool("first")
    writer = threading.Thread(target=spool_writer.write_spool, args=(store.config, 1.5))
    writer.start()
    deadline = time.monotonic() + 30
    while first.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # ten polls with nothing to write: a writer without linger would be gone
    second = spool("second")
    spool_writer.write_spool(store.config, 0.0)  # another writer: the lingering one is alive
    assert second.exists()
    writer.join(timeout=30)
    assert not writer.is_alive()
    assert not first.exists() and not second.exists()
    assert len(opened) == 1  # MLflow opened once for both records
    assert {"first", "second"} <= set(runs_by_stage(store))


def test_a_stage_starts_no_writer_while_one_is_alive(
    store: Tracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipeline's lingering writer writes the next stage's record: the stage does not start a
    process (0.3–0.5 s of CPU a stage) only to find it alive; with none alive it starts one."""
    from modelupgrade.registry import spool_writer

    started: list[object] = []
    monkeypatch.setattr(spool_writer, "start_spool_writer", started.append)
    store.config.spool_dir.mkdir(parents=True, exist_ok=True)
    with spool_writer._sole_writer(store.config) as sole:  # a writer at work
        assert sole
        assert spool_writer.ensure_spool_writer(store.config) is None
    assert started == []
    spool_writer.ensure_spool_writer(store.config)
    assert started == [store.config]
