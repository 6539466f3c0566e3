"""The Prefect flows end to end on a tiny IDX dataset, against a temporary Prefect API.

One module-wide ``prefect_test_harness`` serves every test (its server starts once); each test has a
hard time limit, so a hung server fails the test instead of stalling CI. Models are ResNet-10s with
8 channels on 16×16 images, trained for one epoch.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
import yaml

import modelupgrade.training.pipeline as training_pipeline
from modelupgrade.errors import DataValidationError, UserError

pytestmark = pytest.mark.timeout(240, method="thread")

GENERATIONS = 3


def tiny_params(dataset_root: Path, work_dir: Path, **flows: Any) -> dict[str, Any]:
    return {
        "seed": 7,
        "device": "cpu",
        "dataset": {
            "name": "tiny",
            "loader": "idx",
            "root": str(dataset_root),
            "min_images_per_class": 2,
        },
        "evaluation_split": {"queries_per_class": 2, "gallery_per_class": 4},
        "scenarios": {},
        "architectures": {
            "default": {
                "backbone": "resnet10t",
                "cifar_stem": False,
                "embedding_dim": 8,
                "backbone_kwargs": {"channels": [8, 8, 8, 8], "stem_width": 8},
            }
        },
        "training": {"epochs": 1, "batch_size": 16, "cpu_threads": 1},
        "strategies": {"bct": {"kind": "bct"}, "independent": {"kind": "independent"}},
        "sequential": {"fractions": [0.25, 0.5, 0.75], "strategies": ["bct"]},
        "heads": {"bict": {"kind": "bict", "hidden_dim": 8, "epochs": 1, "batch_size": 8}},
        "registry": {"model_name": "tiny"},
        "store": {"chunk_size": 4},
        "flows": {
            "strategy": "bct",
            "heads": ["bict"],
            "retries": 1,
            "retry_delay_seconds": 0,
            "work_dir": str(work_dir),
            **flows,
        },
    }


def make_project(
    root: Path, template_db: Path, monkeypatch: pytest.MonkeyPatch, **flows: Any
) -> SimpleNamespace:
    """A dataset, a params file and an MLflow store in ``root``, which becomes
    the working directory."""
    from tests.data_fixtures import write_idx_dataset

    root.mkdir(parents=True, exist_ok=True)
    write_idx_dataset(root / "idx", train=96, test=32, classes=4, size=16)
    params_path = root / "params.yaml"
    params_path.write_text(yaml.safe_dump(tiny_params(root / "idx", root / "work", **flows)))
    shutil.copyfile(template_db, root / "mlflow.db")
    monkeypatch.chdir(root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
    return SimpleNamespace(root=root, params=str(params_path), work=root / "work")


def registry_of(project: SimpleNamespace) -> Any:
    from modelupgrade.chain import load_chain

    return load_chain(project.params).registry()


def artifacts(key: str) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )


def require_prefect_server() -> None:
    """Fail at once, saying why, when Prefect's API server cannot even be imported, instead of
    after a start-up timeout (prefect 3.8.8 passes ``Body(min_items=...)``, which
    FastAPI > 0.150 rejects)."""
    try:
        import prefect.server.api.server  # noqa: F401
    except Exception as err:  # noqa: BLE001 - any import failure means no server
        pytest.fail(
            f"Prefect's API server does not import: {type(err).__name__}: {err}", pytrace=False
        )


@pytest.fixture(scope="module")
def harness():
    from prefect.testing.utilities import prefect_test_harness

    require_prefect_server()
    with pytest.MonkeyPatch.context() as mp:
        # Loopback only: the temporary server must not try to send usage statistics.
        mp.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        mp.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        with prefect_test_harness(server_startup_timeout=60):
            yield


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated MLflow database, copied for each project (migrating takes seconds)."""
    from tests.registry_support import make_template

    return make_template(tmp_path_factory.mktemp("mlflow-template"))


@pytest.fixture(scope="module")
def lineage_run(harness, template_db: Path, tmp_path_factory: pytest.TempPathFactory):
    """``flows.lineage`` over three generations, with the first training attempt
    failing transiently."""
    from flows.lineage import lineage

    with pytest.MonkeyPatch.context() as mp:
        project = make_project(tmp_path_factory.mktemp("lineage"), template_db, mp)
        real_train = training_pipeline.train_model
        attempts: list[str] = []

        def flaky_train(**kwargs: Any) -> Any:
            attempts.append(str(kwargs["out_dir"]))
            if len(attempts) == 1:
                raise OSError("the shared disk went away for a moment")
            return real_train(**kwargs)

        mp.setattr(training_pipeline, "train_model", flaky_train)
        result = lineage(GENERATIONS, project.params, None)
        mp.setattr(training_pipeline, "train_model", real_train)
        yield SimpleNamespace(project=project, result=result, attempts=attempts)


def test_lineage_registers_the_chain_with_lineage_gates_and_matrix(lineage_run) -> None:
    project, result = lineage_run.project, lineage_run.result
    # The transient OSError was retried: gen0 was attempted twice, then every other model once.
    assert (
        lineage_run.attempts[0]
        == lineage_run.attempts[1]
        == str(project.work / "models/sequential/gen0")
    )
    # gen0, then bct + oracle per cycle
    assert len(lineage_run.attempts) == 1 + 1 + 2 * (GENERATIONS - 1)

    registry = registry_of(project)
    versions = registry.versions()
    assert [v.model_key for v in versions] == ["gen0", "bct/gen1", "bct/gen2"]
    assert [v.parent_version for v in versions] == [None, versions[0].version, versions[1].version]
    assert registry.champion().model_key == "gen0"
    assert versions[0].gates_status == "first-generation"
    for version in versions[1:]:
        # Gated against the champion, with Δ↓ measured against the oracle chain.
        assert version.tags["gates.against_version"] == str(versions[0].version)
        assert version.gates_status in ("true", "false")
        assert version.tags["gate.degradation.value"] != "n/a"
        assert version.tags["heads"].endswith("/bict")
    candidate = registry.by_alias("candidate")
    passed = [v for v in versions[1:] if v.gates_status == "true"]
    assert (candidate is None) == (not passed) and (candidate is None or candidate in passed)

    assert [row["model"] for row in result["lineage"]] == ["gen0", "bct/gen1", "bct/gen2"]
    matrix = result["compatibility"]["matrix"]
    assert [row["query"] for row in matrix] == ["gen0", "gen1", "gen2"]
    for i, row in enumerate(matrix):
        assert all((row[f"gen{j}"] is None) == (j > i) for j in range(GENERATIONS))
    assert Path(result["heatmap"]).is_file() and Path(result["report"]).is_file()
    for generation in range(GENERATIONS):
        report = project.work / "reports" / f"upgrade-gen{generation}.md"
        assert report.read_text().startswith(f"# Upgrade cycle gen{generation}:")
    assert "## Compatibility matrix" in Path(result["report"]).read_text()

    assert artifacts("compatibility-matrix") and artifacts("lineage-report")
    assert len(artifacts("upgrade-report")) >= GENERATIONS and artifacts("upgrade-metrics")


def test_lineage_run_again_resumes_trains_nothing_and_keeps_to_its_work_dir(
    lineage_run, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.lineage import lineage

    def must_not_train(**kwargs: Any) -> None:
        raise AssertionError("a finished lineage trained again")

    monkeypatch.setattr(training_pipeline, "train_model", must_not_train)
    again = lineage(GENERATIONS, lineage_run.project.params, None)
    assert again["lineage"] == lineage_run.result["lineage"]
    with pytest.raises(UserError, match="must lie in 1..3"):
        lineage(GENERATIONS + 1, lineage_run.project.params, None)
    # The registered chain lives in its work directory; another one cannot continue it.
    with pytest.raises(UserError, match="is not the model in"):
        lineage(
            GENERATIONS, lineage_run.project.params, str(lineage_run.project.root / "elsewhere")
        )


def test_upgrade_takes_only_validated_snapshots(lineage_run) -> None:
    from flows.upgrade import upgrade

    project = lineage_run.project
    # The planned slices are used up: the scheduled cycle has nothing to train on.
    assert upgrade(project.params)["status"] == "skipped"

    manifest = pd.read_parquet(project.work / "data/manifests/tiny.parquet")
    leaking = project.root / "leaking.parquet"
    manifest.to_parquet(leaking)  # evaluation images in a training snapshot
    splits_before = (project.work / "data/splits/sequential/split_info.json").read_text()
    with pytest.raises(DataValidationError, match="image_in_evaluation_sets"):
        upgrade(project.params, snapshot=str(leaking))
    assert (project.work / "data/splits/sequential/split_info.json").read_text() == splits_before
    assert len(registry_of(project).versions()) == GENERATIONS
    assert upgrade(project.params)["status"] == "skipped"

    grown = project.root / "grown.parquet"
    manifest[manifest.source_split == "train"].to_parquet(grown)
    cycle = upgrade(project.params, snapshot=str(grown))
    assert cycle["status"] == "registered" and cycle["model_key"] == f"bct/gen{GENERATIONS}"
    assert (
        registry_of(project).by_key(f"bct/gen{GENERATIONS}").parent_version == cycle["version"] - 1
    )
    assert (
        len(pd.read_parquet(project.work / f"data/splits/sequential/gen{GENERATIONS}.parquet"))
        == 96
    )


def test_backfill_follows_the_champion(lineage_run) -> None:
    from flows.backfill import backfill
    from modelupgrade.registry import promote

    project = lineage_run.project
    created = backfill(project.params)
    assert created["outcome"] == "created, serving gen0"
    assert created["store_status"]["items_by_space"] == {"gen0": 16}

    registry = registry_of(project)
    promote(
        registry, registry.by_key("bct/gen2").version, "test: the candidate serves now", force=True
    )
    moved = backfill(project.params)
    assert moved["outcome"] == "backfilled gen0 → gen2"
    assert moved["backfill"]["status"] == "complete" and moved["backfill"]["items_written"] == 16
    assert moved["store_status"]["serving_space"] == "gen2"
    assert moved["store_status"]["items_by_space"] == {"gen2": 16}
    progress = artifacts("backfill-progress")
    assert progress and progress[0].data == 100.0
    assert "backfilled gen0 → gen2" in Path(moved["report"]).read_text()
    assert backfill(project.params)["outcome"] == "up to date, serving gen2"


def test_a_backfill_left_running_is_finished_before_the_next_one(
    lineage_run,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dataclasses

    from flows.backfill import backfill
    from modelupgrade.registry import promote
    from modelupgrade.store.job import BackfillJob

    project = lineage_run.project
    store = str(project.root / "another-store")
    registry = registry_of(project)
    promote(registry, registry.by_key("gen0").version, "test: a store on gen0", force=True)
    assert backfill(project.params, store=store)["outcome"] == "created, serving gen0"
    promote(registry, registry.by_key("bct/gen1").version, "test: gen1 serves", force=True)
    real_run = BackfillJob.run

    def stopped_after_one_chunk(job: BackfillJob, max_chunks: int | None = None) -> Any:
        return dataclasses.replace(real_run(job, max_chunks=1), status="stopped")

    monkeypatch.setattr(BackfillJob, "run", stopped_after_one_chunk)
    halted = backfill(project.params, store=store)
    assert halted["outcome"] == "backfill to gen1 stopped; the next run resumes it"
    assert halted["backfill"]["items_written"] == 4  # one chunk of store.chunk_size
    monkeypatch.setattr(BackfillJob, "run", real_run)

    # The champion moves on before the store got there: the running backfill is finished first.
    promote(registry, registry.by_key("bct/gen2").version, "test: gen2 serves", force=True)
    resumed = backfill(project.params, store=store)
    assert resumed["steps"] == ["gen1", "gen2"]
    assert resumed["outcome"] == "backfilled gen1 → gen2"
    assert (
        resumed["backfill"]["target_space"] == "gen2" and resumed["backfill"]["items_written"] == 16
    )
    assert resumed["store_status"]["items_by_space"] == {"gen2": 16}


def test_a_failing_task_fails_its_flow_and_registers_nothing(
    harness,
    template_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flows.upgrade import upgrade

    project = make_project(tmp_path, template_db, monkeypatch)
    attempts = []

    def broken_train(**kwargs: Any) -> None:
        attempts.append(kwargs["out_dir"])
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(training_pipeline, "train_model", broken_train)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        upgrade(project.params)
    assert len(attempts) == 2  # flows.retries = 1
    assert registry_of(project).versions() == []

    # Bad input is not retried: it would fail the same way again.
    import modelupgrade.chain

    reads = []
    real_read = modelupgrade.chain.read_manifest
    monkeypatch.setattr(
        modelupgrade.chain, "read_manifest", lambda path: reads.append(path) or real_read(path)
    )
    with pytest.raises(UserError, match="missing.parquet does not exist"):
        upgrade(project.params, snapshot=str(tmp_path / "missing.parquet"))
    assert reads == [str(tmp_path / "missing.parquet")]
    assert registry_of(project).versions() == []


def test_training_on_a_gpu_pool_deployment_failing_fails_the_cycle(
    harness,
    template_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import prefect.deployments
    from prefect.states import Failed

    from flows.upgrade import upgrade

    project = make_project(
        tmp_path, template_db, monkeypatch, training_deployment="train-generation/gpu"
    )
    requested = []

    def remote_run(name: str, parameters: dict[str, Any], timeout: float | None) -> Any:
        requested.append((name, parameters, timeout))
        return SimpleNamespace(name="gpu-run", state=Failed(message="worker lost its GPU"))

    monkeypatch.setattr(prefect.deployments, "run_deployment", remote_run)
    with pytest.raises(
        RuntimeError, match="'train-generation/gpu' ended Failed: worker lost its GPU"
    ):
        upgrade(project.params)
    assert requested == [
        (
            "train-generation/gpu",
            {"generation": 0, "params_path": project.params, "work_dir": str(project.work)},
            None,
        )
    ]
    assert registry_of(project).versions() == []


def test_flow_params_are_checked(tmp_path: Path) -> None:
    from modelupgrade.chain import load_chain
    from modelupgrade.config import FlowParams, ParamsError
    from modelupgrade.params import load_params

    assert FlowParams().upgrade_cron == "0 3 * * 1"
    for bad in (
        {"upgrade_cron": "0 0 3 * * 1"},
        {"training_deployment": "gpu"},
        {"retries": -1},
        {"shedule": "x"},
    ):
        with pytest.raises(ValueError):
            FlowParams(**bad)
    params = tiny_params(tmp_path, tmp_path / "work", strategy="nope")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(UserError, match="flows.strategy is 'nope'"):
        load_chain(tmp_path / "params.yaml")
    params["flows"].update(strategy="bct", heads=["fct"])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(UserError, match=r"flows.heads names \['fct'\]"):
        load_chain(tmp_path / "params.yaml")
    params["flows"]["upgrade_cron"] = "every monday"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ParamsError, match="flows.upgrade_cron: .*5 fields"):
        load_params(tmp_path / "params.yaml")
