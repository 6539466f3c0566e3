"""MLflow tracking, registration with lineage, gates, promotion and the round
trip, on temp stores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from modelupgrade.errors import UserError
from modelupgrade.registry import (
    PARENT_RUN_ENV,
    ModelRegistry,
    RegistrationSummary,
    Tracker,
    TrackingConfig,
    format_lineage,
    promote,
)
from modelupgrade.registry import tracker as tracker_module
from tests.registry_support import (
    fresh_tracker,
    image_batch,
    seed_study,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fresh_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Tracker]:
    """A brand-new store opened the way stages open it (params defaults, project root)."""
    from modelupgrade.config import RegistryParams

    root = tmp_path_factory.mktemp("fresh")
    saved = os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        config = TrackingConfig.from_params(RegistryParams(), root=root)
    finally:
        if saved is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved
    return root, Tracker(config)


@pytest.fixture(scope="module")
def template_db(fresh_store: tuple[Path, Tracker]) -> Path:
    return fresh_store[1].config.sqlite_path


@pytest.fixture(scope="module")
def study(template_db: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("study")
    tracker = fresh_tracker(template_db, root)
    registry, outcomes, models = seed_study(tracker, "toy-retrieval", root / "models")
    return tracker, registry, outcomes, models


def test_fresh_database_gets_schema_experiment_and_local_artifact_root(
    fresh_store: tuple[Path, Tracker], monkeypatch: pytest.MonkeyPatch
) -> None:
    from modelupgrade.config import RegistryParams

    root, tracker = fresh_store
    assert tracker.config.tracking_uri == f"sqlite:///{root / 'mlflow.db'}"
    experiment = tracker.client.get_experiment(tracker.experiment_id)
    assert experiment.name == "modelupgrade"
    assert experiment.artifact_location == (root / "mlartifacts").as_uri()
    assert (root / "mlflow.db").is_file()
    assert not (root / "mlruns").exists()  # never the deprecated file store
    assert Tracker(tracker.config).experiment_id == tracker.experiment_id  # reopening reuses it

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(UserError, match="file store"):
        TrackingConfig.from_params(RegistryParams(tracking_uri="./mlruns"), root=root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.team:5000")
    server = TrackingConfig.from_params(RegistryParams(), root=root)
    assert server.tracking_uri == "http://mlflow.team:5000" and not server.is_local


def test_stage_runs_nest_under_one_parent_per_execution(
    template_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PARENT_RUN_ENV, "")  # restored (unset) after the test
    tracker = fresh_tracker(template_db, tmp_path)
    monkeypatch.setattr(tracker_module, "execution_key", lambda: "dvc:4242:1")
    report = tmp_path / "report.md"
    report.write_text("# report\n")
    with tracker.stage_run("train", params={"training": {"lr": 0.1}}) as first:
        first.log_metrics({"loss": 0.5, "note": "not a number"}, step=1)
        first.log_artifact(report, "reports")
    with tracker.stage_run("evaluate") as second:
        second.log_metrics({"map": 0.6})
    runs = {r.info.run_id: r for r in tracker.client.search_runs([tracker.experiment_id])}
    parent_id = runs[first.run_id].data.tags["mlflow.parentRunId"]
    assert runs[second.run_id].data.tags["mlflow.parentRunId"] == parent_id
    parent = runs[parent_id]
    assert {"git_commit", "dvc_data_hash", "user"} <= set(parent.data.tags)
    assert runs[first.run_id].data.params == {"training.lr": "0.1"}
    assert runs[first.run_id].data.metrics == {"loss": 0.5}
    assert [a.path for a in tracker.client.list_artifacts(first.run_id, "reports")] == [
        "reports/report.md"
    ]
    assert runs[second.run_id].info.status == "FINISHED"

    # A new `dvc repro` is a new dvc process: it gets a new parent.
    monkeypatch.setattr(tracker_module, "execution_key", lambda: "dvc:4243:7")
    with tracker.stage_run("train") as third:
        pass
    assert tracker.client.get_run(third.run_id).data.tags["mlflow.parentRunId"] != parent_id

    # An orchestrator groups its stages under the parent it opened.
    own = tracker.start_pipeline_run("prefect-flow")
    with tracker.stage_run("train") as fourth:
        pass
    assert tracker.client.get_run(fourth.run_id).data.tags["mlflow.parentRunId"] == own

    with pytest.raises(RuntimeError), tracker.stage_run("broken") as failing:
        raise RuntimeError("boom")
    assert tracker.client.get_run(failing.run_id).info.status == "FAILED"


def test_registration_tags_lineage_and_aliases(study) -> None:
    _tracker, registry, outcomes, _ = study
    by_key = {o.model_key: o for o in outcomes}
    assert by_key["gen0"].gates == "first-generation"
    assert by_key["gen1-bct"].gates == "pass"
    assert by_key["gen1-independent"].failed_gates == ["compatibility", "negative_flips"]
    assert by_key["gen1-dmu"].failed_gates == ["negative_flips"]

    versions = {v.model_key: v for v in registry.versions()}
    gen0, bct, dmu = versions["gen0"], versions["gen1-bct"], versions["gen1-dmu"]
    assert gen0.aliases == ["champion"] and bct.aliases == ["candidate"]
    assert bct.tags["parent_version"] == str(gen0.version)
    assert bct.tags["strategy"] == "bct" and bct.tags["generation"] == "gen1"
    assert bct.tags["scenario"] == "toy" and bct.tags["data_hash"] == "sha256:abc"
    assert bct.tags["git_commit"]
    assert bct.tags["gate.compatibility.value"] == "0.55"
    assert bct.tags["gates.against_version"] == str(gen0.version)
    # dmu reaches gen0's gallery through its adapter: compatible even though a gate failed.
    assert dmu.tags["compatible_with"] == str(gen0.version)
    assert versions["gen1-independent"].tags["compatible_with"] == "none"

    tree = format_lineage(registry.name, registry.versions())
    assert tree.splitlines()[0] == "toy-retrieval"
    assert tree.splitlines()[1].startswith(f"└── v{gen0.version} gen0")
    assert "[champion]" in tree.splitlines()[1]
    bct_line = next(line for line in tree.splitlines() if "gen1-bct" in line)
    assert bct_line.startswith("    ") and "strategy=bct" in bct_line and "gates=pass" in bct_line
    assert "[candidate]" in bct_line
    assert "gates=FAIL(compatibility,negative_flips)" in tree


def test_load_round_trip_by_alias_and_version(study, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow
    import mlflow.pytorch

    tracker, registry, _, models = study
    images = image_batch(5)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracker.config.tracking_uri)
    mlflow.set_tracking_uri(tracker.config.tracking_uri)
    try:
        champion = mlflow.pytorch.load_model("models:/toy-retrieval@champion")
    finally:
        mlflow.set_tracking_uri(None)
    torch.testing.assert_close(champion(images), models["gen0"](images))
    bct = registry.by_key("gen1-bct")
    loaded = registry.load_model(version=bct.version)
    assert registry.model_uri(version=bct.version) == f"models:/toy-retrieval/{bct.version}"
    embedded = loaded(images)
    assert embedded.shape == (5, 4)
    torch.testing.assert_close(embedded, models["gen1-bct"](images))
    torch.testing.assert_close(embedded.norm(dim=1), torch.ones(5))


def test_promotion_refuses_failed_gates_and_records_forced_promotion(
    template_db: Path, tmp_path: Path
) -> None:
    tracker = fresh_tracker(template_db, tmp_path)
    registry, _, _ = seed_study(tracker, "promo", tmp_path / "models")
    gen0 = registry.by_key("gen0").version
    independent = registry.by_key("gen1-independent").version
    bct = registry.by_key("gen1-bct").version

    with pytest.raises(UserError, match="did not pass its gates.*compatibility"):
        promote(registry, independent, "looks good")
    assert registry.champion().version == gen0
    with pytest.raises(UserError, match="needs a reason"):
        promote(registry, bct, "  ")

    result = promote(
        registry, independent, "re-index the gallery tonight", force=True, user="alice"
    )
    assert result.forced and result.previous_champion == gen0
    info = registry.version(independent)
    assert info.aliases == ["champion"]
    assert info.tags["promoted_by"] == "alice"
    assert info.tags["promotion_reason"] == "re-index the gallery tonight"
    assert info.tags["promotion_forced"] == "true"

    # The candidate, promoted normally: the alias moves, the candidate alias is used up, and the
    # note says its gates were measured against an older champion.
    result = promote(registry, bct, "passed the gates", user="bob")
    assert not result.forced and registry.champion().version == bct
    assert registry.by_alias("candidate") is None
    assert any("measured against version" in n for n in result.notes)
    with pytest.raises(UserError, match="already the champion"):
        promote(registry, bct, "again")
    with pytest.raises(UserError, match="has no version 99"):
        promote(registry, 99, "missing")


def test_reregistering_the_same_checkpoint_adds_no_version(
    template_db: Path, tmp_path: Path
) -> None:
    from modelupgrade.registry import GenerationRecord
    from tests.registry_support import TinyEmbedder

    tracker = fresh_tracker(template_db, tmp_path)
    registry = ModelRegistry(tracker, "idempotent")
    record = GenerationRecord("gen0", "gen0", "initial", "toy", checkpoint_sha256="abc123")
    with tracker.stage_run("register") as run:
        first = registry.register(TinyEmbedder(), record, run)
        again = registry.register(TinyEmbedder(), record, run)
        with pytest.raises(UserError, match="not registered"):
            registry.register(
                TinyEmbedder(),
                GenerationRecord("gen2", "gen2", "bct", "toy", parent_key="gen1"),
                run,
            )
    assert again.version == first.version and len(registry.versions()) == 1


_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from modelupgrade.registry import Tracker, TrackingConfig

    db, artifacts, name = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    tracker = Tracker(TrackingConfig(f"sqlite:///{db}", "concurrent", artifacts))
    for i in range(3):
        with tracker.stage_run(f"{name}-{i}", params={"writer": name, "i": i}) as run:
            for step in range(10):
                run.log_metrics({"value": step}, step=step)
            run.set_tags({"writer": name})
    """
)


def test_two_processes_write_to_one_store_concurrently(template_db: Path, tmp_path: Path) -> None:
    tracker = fresh_tracker(template_db, tmp_path)  # migrated copy with the experiment created
    db = tracker.config.sqlite_path
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop(PARENT_RUN_ENV, None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(db), str(tmp_path / "mlartifacts"), name],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in ("a", "b")
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    reader = Tracker(TrackingConfig(f"sqlite:///{db}", "concurrent", tmp_path / "mlartifacts"))
    runs = reader.client.search_runs([reader.experiment_id], filter_string="tags.writer != ''")
    assert sorted(r.data.tags["writer"] for r in runs) == ["a"] * 3 + ["b"] * 3
    for run in runs:
        history = reader.client.get_metric_history(run.info.run_id, "value")
        assert sorted(m.step for m in history) == list(range(10))
    # Each process is its own execution: two parents, each holding its own three stages.
    parents = {r.data.tags["mlflow.parentRunId"] for r in runs}
    assert len(parents) == 2


def test_cli_lineage_and_promote(
    study, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from modelupgrade.cli import main

    tracker, registry, _, _ = study
    params = tmp_path / "params.yaml"
    params.write_text(
        json.dumps(
            {
                "scenarios": {"toy": {"kind": "extended-data", "strategies": ["bct"]}},
                "architectures": {"default": {}},
                "strategies": {"bct": {"kind": "bct"}},
                "sequential": {"strategies": ["bct"]},
                "registry": {
                    "model_name": "toy",
                    "experiment": "test",
                    "artifact_root": str(tracker.config.artifact_root),
                },
            }
        )
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracker.config.tracking_uri)
    main(["lineage", "--scenario", "retrieval", "--params", str(params)])
    assert capsys.readouterr().out.startswith("toy-retrieval\n└── v1 gen0")
    main(["lineage", "--params", str(params), "--json"])
    rows = json.loads(capsys.readouterr().out)["toy-retrieval"]
    assert [r["strategy"] for r in rows] == ["initial", "independent", "bct", "dmu"]

    dmu = registry.by_key("gen1-dmu").version
    with pytest.raises(SystemExit) as refused:
        main(["promote", "--version", str(dmu), "--reason", "try", "--params", str(params)])
    assert refused.value.code != 0 and "negative_flips" in capsys.readouterr().err


def _toy_study(root: Path) -> None:
    """The files the register stage reads, shaped like the train and evaluate stages write them."""
    import pandas as pd

    from modelupgrade.io import write_json

    for key in ("gen0", "gen1-independent", "gen1-bct"):
        (root / "models/toy" / key).mkdir(parents=True)
        (root / "models/toy" / key / "checkpoint.pt").write_bytes(key.encode())
        write_json(root / "models/toy" / key / "card.json", {"strategy": key})
    from modelupgrade.heads import build_head, save_head

    save_head(
        build_head("bict", 4, 4, 8, 2),
        root / "heads/toy/bict-bct",
        name="bict",
        sources={"new_model": {"path": "models/toy/gen1-bct"}},
    )
    rows = [
        ("gen0", "gen0", 0.50, None),
        ("gen1-independent", "gen1-independent", 0.70, None),
        ("gen1-bct", "gen1-bct", 0.66, None),
        ("gen1-independent", "gen0", 0.01, 0.80),
        ("gen1-bct", "gen0", 0.52, 0.05),
        ("gen1-bct", "bict-bct(gen0)", 0.60, 0.03),
    ]
    table = [(q, g, "mAP", v) for q, g, v, _ in rows]
    table += [(q, g, "negative_flip_rate", f) for q, g, _, f in rows if f is not None]
    (root / "metrics/toy").mkdir(parents=True)
    pd.DataFrame(table, columns=["query_set", "gallery_set", "metric", "value"]).to_parquet(
        root / "metrics/toy/cross_model.parquet"
    )

    def summary_row(comparison: str, gallery: str, value: float) -> dict[str, object]:
        return {
            "comparison": comparison,
            "query_set": "gen1-bct",
            "gallery_set": gallery,
            "metric": "mAP",
            "value": value,
            "delta_up_pct": 0.0,
            "delta_down_pct": 5.7,
            "negative_flip_rate": 0.05,
        }

    write_json(
        root / "metrics/toy/summary.json",
        {
            "scenario": "toy",
            "protocol": {"protocol": "query-gallery"},
            "headline_metric": "mAP",
            "old_model": "gen0",
            "oracle": "gen1-independent",
            "device": "cpu",
            "old_self": 0.50,
            "oracle_self": 0.70,
            "delta_down_pct": {"gen1-independent": 0.0, "gen1-bct": 5.7},
            "strategies": {
                "bct": [
                    summary_row("self", "gen1-bct", 0.66),
                    summary_row("backward", "gen0", 0.52),
                ]
            },
        },
    )


def test_register_stage_gates_from_evaluate_outputs_and_explicit_numbers(
    template_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modelupgrade.config import parse_params
    from modelupgrade.layout import StudyLayout
    from modelupgrade.registry.scenario import register_scenario
    from modelupgrade.registry.sources import scenario_sources
    from tests.registry_support import TinyEmbedder

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(PARENT_RUN_ENV, "")
    _toy_study(tmp_path)
    params = parse_params(
        {
            "scenarios": {"toy": {"kind": "extended-data", "strategies": ["independent", "bct"]}},
            "architectures": {"default": {}},
            "strategies": {"independent": {"kind": "independent"}, "bct": {"kind": "bct"}},
            "sequential": {"strategies": ["bct"]},
            "registry": {"model_name": "study"},
        }
    )
    tracker = fresh_tracker(template_db, tmp_path / "store")
    models: dict[str, TinyEmbedder] = {}

    def load(model_dir: Path) -> TinyEmbedder:
        return models.setdefault(model_dir.name, TinyEmbedder())

    out = tmp_path / "registry/toy.json"
    record = register_scenario(params, "toy", out, StudyLayout(), load_model=load, tracker=tracker)
    summary = record.as_dict()
    assert json.loads(out.read_text()) == summary
    assert RegistrationSummary.from_dict(summary) == record
    assert summary["registered_model"] == "study-toy" and summary["gate_metric"] == "mAP"
    by_key = {g["model_key"]: g for g in summary["generations"]}
    # Through its BiCT adapter bct searches gen0's gallery well, but Δ↓ 5.7% > 5%: no candidate.
    assert by_key["gen1-bct"]["failed_gates"] == ["degradation"]
    assert by_key["gen1-bct"]["cross_score"] == 0.60
    assert by_key["gen1-independent"]["failed_gates"] == ["compatibility", "negative_flips"]
    assert summary["champion"] == by_key["gen0"]["version"] and summary["candidate"] is None
    registry = ModelRegistry(tracker, "study-toy")
    bct = registry.by_key("gen1-bct")
    assert bct.tags["heads"] == "bict-bct" and bct.tags["compatible_with"] == str(
        summary["champion"]
    )
    assert [
        a.path for a in tracker.client.list_artifacts(bct.run_id, "gen1-bct/heads/bict-bct")
    ] == ["gen1-bct/heads/bict-bct/card.json", "gen1-bct/heads/bict-bct/head.pt"]

    # Explicit numbers override measured ones; the same checkpoints are not registered twice.
    override = tmp_path / "gates.json"
    override.write_text(json.dumps({"models": {"gen1-bct": {"degradation_pct": 3.0}}}))
    again = register_scenario(
        params, "toy", out, StudyLayout(), load_model=load, tracker=tracker, gate_metrics=override
    ).as_dict()
    assert [g["version"] for g in again["generations"]] == [
        g["version"] for g in summary["generations"]
    ]
    assert again["candidate"] == bct.version
    assert registry.version(bct.version).tags["gates.passed"] == "true"

    with pytest.raises(UserError, match="gen1-dmu/checkpoint.pt does not exist"):
        scenario_sources(
            params.model_copy(
                update={
                    "scenarios": {
                        "toy": params.scenarios["toy"].model_copy(update={"strategies": ["dmu"]})
                    }
                }
            ),
            "toy",
            StudyLayout(),
        )


def test_a_chain_read_back_from_the_registry_is_checked_against_its_work_directory(
    template_db: Path, tmp_path: Path
) -> None:
    from modelupgrade.io import file_sha256
    from modelupgrade.layout import StudyLayout
    from modelupgrade.registry import GenerationRecord
    from modelupgrade.registry.chain import read_chain
    from tests.registry_support import TinyEmbedder

    layout = StudyLayout(tmp_path / "work")
    tracker = fresh_tracker(template_db, tmp_path / "store")
    registry = ModelRegistry(tracker, "chain-sequential")
    assert read_chain(registry, "bct", layout).as_dict() == {
        "registered_model": "chain-sequential",
        "tracking_uri": tracker.config.tracking_uri,
        "generations": [],
        "next_generation": 0,
        "champion": None,
    }

    def checkpoint(name: str) -> str:
        directory = layout.model("sequential", name)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "checkpoint.pt").write_bytes(name.encode())
        return file_sha256(directory / "checkpoint.pt")

    def record(key: str, parent: str | None) -> GenerationRecord:
        return GenerationRecord(
            key,
            key.split("/")[-1],
            "bct",
            "sequential",
            parent_key=parent,
            checkpoint_sha256=checkpoint(key),
        )

    with tracker.stage_run("register") as run:
        first = registry.register(TinyEmbedder(), record("gen0", None), run)
        registry.register(TinyEmbedder(), record("bct/gen1", "gen0"), run)
    registry.set_alias("champion", first.version)
    state = read_chain(registry, "bct", layout)
    assert (state.generations, state.next_generation) == ([0, 1], 2)
    assert state.champion.as_dict() == {
        "version": first.version,
        "model_key": "gen0",
        "generation": 0,
    }

    # Another chain's view of the same registered model, another work directory, a changed model.
    with pytest.raises(UserError, match="'bct/gen1' .* which is not in the 'dmu' chain"):
        read_chain(registry, "dmu", layout)
    with pytest.raises(UserError, match="is not the model in .*elsewhere"):
        read_chain(registry, "bct", StudyLayout(tmp_path / "elsewhere"))
    (layout.model("sequential", "bct/gen1") / "checkpoint.pt").write_bytes(b"retrained")
    with pytest.raises(UserError, match=r"\(bct/gen1\) is not the model in"):
        read_chain(registry, "bct", layout)
    checkpoint("bct/gen1")
    # A gap: gen3 registered right after gen1 (the registry only asks for a registered parent).
    with tracker.stage_run("register") as run:
        registry.register(TinyEmbedder(), record("bct/gen3", "bct/gen1"), run)
    with pytest.raises(UserError, match=r"has generations \[0, 1, 3\], with gaps"):
        read_chain(registry, "bct", layout)


def test_the_commit_is_dirty_for_a_changed_file_but_not_for_dvc_rewriting_its_lock(
    tmp_path: Path,
) -> None:
    from modelupgrade.registry import git_commit

    def git(*args: str) -> str:
        command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
        return subprocess.run(command, cwd=tmp_path, check=True, capture_output=True).stdout

    (tmp_path / "sub").mkdir()
    for name in ("dvc.lock", "code.py", "sub/dvc.lock"):
        (tmp_path / name).write_text("v1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    sha = git("rev-parse", "HEAD").decode().strip()
    (tmp_path / "dvc.lock").write_text("v2\n")  # what `dvc repro` does as each stage finishes
    (tmp_path / "sub/dvc.lock").write_text("v2\n")
    assert git_commit(tmp_path / "sub") == git_commit(tmp_path) == sha
    (tmp_path / "code.py").write_text("v2\n")
    assert git_commit(tmp_path / "sub") == git_commit(tmp_path) == f"{sha}-dirty"
