"""Models made elsewhere in the registry and the flows: an adopted model registers with its
provenance, a successor trained from it names it as its parent, the training-free adapters
register beside the new model with their kind, sample size and model pair, and the Prefect
upgrade flow takes an adopted model instead of training one.

The adopted source files are written here with timm and torch directly (``tests.test_adopt``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import timm
import torch
import yaml

from modelupgrade.commands.adopt import adopt
from modelupgrade.commands.registry import lineage
from modelupgrade.commands.training import embed, train
from modelupgrade.config.heads import AdapterStudyParams
from modelupgrade.errors import UserError
from modelupgrade.layout import StudyLayout
from modelupgrade.models import embed as embed_images
from modelupgrade.models import load_model, read_model_card
from modelupgrade.registry import PARENT_RUN_ENV, ModelRegistry, RegistrationSummary
from modelupgrade.registry.scenario import register_scenario
from tests.data_fixtures import TOY_PIXELS
from tests.registry_support import fresh_tracker
from tests.test_adopt import (
    embeddings_table,
    params_for,
    sha256,
    timm_with_custom_head,
    torchscript_file,
)

# The flows' module-wide temporary Prefect API, started once when a flow test asks for it.
from tests.test_flows import harness, make_project, registry_of  # noqa: F401

pytestmark = pytest.mark.timeout(240, method="thread")

SPLITS = Path("data/splits/toy")
EVALUATED = [SPLITS / f"{s}.parquet" for s in ("new_train", "query", "gallery")]


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated MLflow database, copied for each store (migrating takes seconds)."""
    from tests.registry_support import make_template

    return make_template(tmp_path_factory.mktemp("mlflow-template"))


@pytest.fixture
def project(tmp_path, monkeypatch):
    from tests.data_fixtures import write_toy_splits

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(PARENT_RUN_ENV, "")
    write_toy_splits(tmp_path, monkeypatch)
    return tmp_path


def with_adapters(params: Any) -> Any:
    """``params`` with an adapter study on toy: Procrustes on both sides, at 16 pairs and all."""
    study = AdapterStudyParams.model_validate(
        {
            "scenarios": {"toy": "bct"},
            "sample_sizes": [16, "all"],
            "heads": {"p": {"kind": "procrustes"}, "pq": {"kind": "procrustes_query"}},
        }
    )
    return params.model_copy(update={"adapters": study})


def register(
    params: Any, template_db: Path, root: Path, **kwargs: Any
) -> tuple[Any, RegistrationSummary]:
    """Register toy's models (``kwargs``: which) in a fresh store under ``root``."""
    tracker = fresh_tracker(template_db, root)
    summary = register_scenario(
        params, "toy", root / "registration.json", StudyLayout(), tracker=tracker, **kwargs
    )
    return ModelRegistry(tracker, summary.registered_model), summary


def same_embeddings(registered: Any, model_dir: Path) -> None:
    images = TOY_PIXELS[:4]
    np.testing.assert_allclose(
        embed_images(registered, images), embed_images(load_model(model_dir), images), atol=1e-6
    )


# ---------------------------------------------------------------- the registry


def test_an_adopted_gen0_its_successor_and_their_adapters_register_with_their_lineage(
    project, template_db, monkeypatch
):
    from modelupgrade.heads.adapter_study import fit_adapter_study

    adopted, dim = timm_with_custom_head(project)
    params = with_adapters(params_for(adopted, dim))
    adopt(params, "old", scenario="toy")
    gen0 = Path("models/toy/gen0")
    embed(params, gen0, split=EVALUATED, out_dir=Path("embeddings/toy/gen0"))
    train(
        params,
        scenario="toy",
        generation=1,
        strategy="bct",
        progress=False,
        embed_split=EVALUATED,
        embed_dir=Path("embeddings/toy/gen1-bct"),
    )
    fitted = fit_adapter_study(params, "toy")
    registry, _ = register(params, template_db, project / "store")

    first = registry.by_key("gen0")
    tags = first.tags
    assert first.aliases == ["champion"] and first.parent_version is None
    assert tags["strategy"] == "adopted" and tags["data_hash"] == "unknown (adopted)"
    assert tags["adopted.kind"] == "timm" and tags["adopted.source"] == adopted["options"]["path"]
    assert tags["adopted.source_sha256"] == sha256(Path(adopted["options"]["path"]))
    assert tags["adopted.preprocessing"] == ("input 16x16, 1 channel(s), mean [0.25], std [0.5]")
    assert tags["adopted.ignored_keys"] == "fc.0.bias, fc.0.weight, fc.2.bias, fc.2.weight"
    assert "training data and training run" in tags["adopted.unknown"]
    assert tags["logged_as"] == "mlflow.pytorch"  # a timm network pickles like a trained one
    same_embeddings(registry.load_model(alias="champion"), gen0)

    successor = registry.by_key("gen1-bct")
    assert successor.parent_version == first.version
    assert successor.tags["strategy"] == "bct" and "adopted.kind" not in successor.tags
    assert successor.tags["data_hash"].startswith("sha256:")

    # Every adapter, at every sample size and on both sides, is logged beside the new model.
    assert len(fitted) == 4
    names = sorted(str(f.head_dir.relative_to("heads/toy")) for f in fitted)
    assert successor.tags["heads"] == ",".join(names)
    for adapter in fitted:
        name = str(adapter.head_dir.relative_to("heads/toy"))
        assert successor.tags[f"head.{name}.kind"] == adapter.card.kind
        assert successor.tags[f"head.{name}.training_free"] == "true"
        assert successor.tags[f"head.{name}.sample_size"] == str(len_of(name))
        assert successor.tags[f"head.{name}.old_model"] == "models/toy/gen0"
        assert successor.tags[f"head.{name}.new_model"] == "models/toy/gen1-bct"
    logged = registry.tracker.client.list_artifacts(successor.run_id, f"gen1-bct/heads/{names[0]}")
    assert {Path(a.path).name for a in logged} == {"card.json", "head.pt"}

    monkeypatch.setenv("MLFLOW_TRACKING_URI", registry.tracker.config.tracking_uri)
    shown = lineage(params, model=registry.name)
    tree = shown.describe().splitlines()
    assert tree[1].startswith(f"└── v{first.version} gen0") and "strategy=adopted" in tree[1]
    assert "origin=adopted timm timm_custom_head.pt" in tree[1]
    assert tree[2].startswith(f"    └── v{successor.version} gen1-bct  parent=v{first.version}")
    rows = shown.as_dict()[registry.name]
    assert [r["origin"] for r in rows] == ["adopted timm timm_custom_head.pt", "trained"]


def len_of(head_name: str) -> int:
    """The training pairs of an adapter named ``<entry>.n<size>-bct`` or ``<entry>.all-bct``."""
    size = head_name.split(".")[-1].removesuffix("-bct")
    return 64 if size == "all" else int(size.removeprefix("n"))


def test_a_torchscript_model_registers_as_its_files_and_an_embeddings_only_one_as_its_card(
    project, template_db
):
    adopted, dim = torchscript_file(project)
    params = params_for(adopted, dim)
    adopt(params, "old", scenario="toy")
    registry, _ = register(params, template_db, project / "ts", strategies=[])
    version = registry.by_key("gen0")
    assert version.tags["logged_as"] == "model-directory"
    assert version.tags["adopted.kind"] == "torchscript"
    client = registry.tracker.client
    files = {Path(a.path).name for a in client.list_artifacts(version.run_id, "gen0/embedder-gen0")}
    # The TorchScript file itself, never a pickle of the foreign module (nor an MLmodel).
    assert files == {"card.json", "checkpoint.pt", "network.torchscript"}
    same_embeddings(registry.load_model(version=version.version), Path("models/toy/gen0"))

    adopted, dim = embeddings_table(project)
    params = params_for(adopted, dim)
    out = Path("vectors/toy/gen0")
    adopt(params, "old", out=out, split=EVALUATED)
    tracker = fresh_tracker(template_db, project / "vectors-store")
    summary = register_scenario(
        params,
        "toy",
        project / "vectors.json",
        StudyLayout(models_root=Path("vectors")),
        tracker=tracker,
        strategies=[],
    )
    registry = ModelRegistry(tracker, summary.registered_model)
    version = registry.by_key("gen0")
    assert version.aliases == ["champion"] and version.tags["logged_as"] == "card-and-checksums"
    assert version.tags["adopted.runs_on_images"] == "false"
    assert version.tags["adopted.preprocessing"] == "none (embeddings only)"
    folder = "gen0/embedder-gen0"
    files = {Path(a.path).name for a in tracker.client.list_artifacts(version.run_id, folder)}
    assert files == {"card.json", "embeddings.json"}  # the vectors stay where they are
    record = json.loads(
        Path(
            tracker.client.download_artifacts(version.run_id, f"{folder}/embeddings.json")
        ).read_text()
    )
    card = read_model_card(out)
    assert record["files_sha256"] == card.weights_sha256 and record["embedding_dim"] == dim
    assert record["source_sha256"] == sha256(Path(adopted["options"]["path"]))
    assert record["loadable_as_pytorch_model"] is False
    with pytest.raises(UserError, match="embeddings-only model: it cannot be loaded as a pytorch"):
        registry.load_model(alias="champion")


# ---------------------------------------------------------------- the upgrade flow


def test_a_new_model_that_cannot_follow_the_chain_is_refused_before_anything_is_written(
    project,
):
    from modelupgrade.chain import check_new_model

    adopted, dim = torchscript_file(project)
    adopt(params_for(adopted, dim), "old", out=Path("ts8"))
    adopted, dim = embeddings_table(project)
    adopt(params_for(adopted, dim), "old", out=Path("vectors8"))
    assert check_new_model(Path("vectors8").resolve(), None)[0] == "card.json"  # gen0: fine
    with pytest.raises(UserError, match="is embeddings-only: a new generation must embed"):
        check_new_model(Path("vectors8"), Path("ts8"))
    adopted, dim = timm_with_custom_head(project)
    adopt(params_for(adopted, dim), "old", out=Path("timm16"))
    with pytest.raises(UserError, match="gives 16-dimensional embeddings .* 8-dimensional ones"):
        check_new_model(Path("timm16"), Path("ts8"))
    assert check_new_model(Path("timm16"), Path("ts8"), heads=["bict"])  # a head maps between
    Path("ts8/network.torchscript").write_bytes(b"replaced")
    with pytest.raises(UserError, match="sha256 differs"):
        check_new_model(Path("ts8"), None)
    with pytest.raises(UserError, match="is not a directory"):
        check_new_model(Path("nowhere"), None)


def adopted_resnet(root: Path, seed: int, width: int = 8) -> Path:
    """A timm ResNet-10 as the flows' tiny chain has it (8 channels: 8-d features on 1×16×16
    images; ``width``-d with a wider last stage), with its own classifier, adopted into a model
    directory."""
    from modelupgrade.models.adopted import adopt_model

    torch.manual_seed(seed)
    kwargs = {"channels": [8, 8, 8, width], "stem_width": 8}
    network = timm.create_model("resnet10t", pretrained=False, num_classes=4, in_chans=1, **kwargs)
    weights = root / f"production-{seed}.pt"
    torch.save(network.state_dict(), weights)
    options = {
        "path": str(weights),
        "network": "resnet10t",
        "network_kwargs": kwargs,
        "classifier_layer": "fc",
        "preprocessing": {"input_size": 16, "channels": 1},
    }
    adopt_model("timm", options, root / f"adopted-{seed}")
    return root / f"adopted-{seed}"


def test_the_upgrade_flow_takes_an_adopted_model_instead_of_training_one(
    harness,  # noqa: F811
    template_db,
    tmp_path,
    monkeypatch,
):
    import modelupgrade.training.pipeline as training_pipeline
    from flows.backfill import backfill
    from flows.upgrade import upgrade
    from modelupgrade.registry import promote

    project = make_project(tmp_path, template_db, monkeypatch)
    params = yaml.safe_load(Path(project.params).read_text())
    # The adopted champion has no classifier to order a backfill by confidence.
    params["store"]["policy"] = "random"
    Path(project.params).write_text(yaml.safe_dump(params))
    production, candidate = adopted_resnet(tmp_path, 0), adopted_resnet(tmp_path, 1)
    trained: list[str] = []
    real_train = training_pipeline.train_model

    def counted(**kwargs: Any) -> Any:
        trained.append(Path(kwargs["out_dir"]).relative_to(project.work).as_posix())
        return real_train(**kwargs)

    monkeypatch.setattr(training_pipeline, "train_model", counted)

    # An empty registry: the production model made elsewhere becomes gen0, the champion.
    first = upgrade(project.params, new_model=str(production))
    assert first["status"] == "registered" and first["model_key"] == "gen0" and trained == []
    # The next cycle trains a compatible successor from it, as from a gen0 trained here.
    second = upgrade(project.params)
    assert second["model_key"] == "bct/gen1"
    # A model that cannot be taken fails the cycle before anything is written or registered.
    with pytest.raises(UserError, match="new model .*nowhere is not a directory"):
        upgrade(project.params, new_model=str(tmp_path / "nowhere"))
    assert not (project.work / "models/sequential/bct/gen2").exists()
    # A candidate made elsewhere replaces training: only the Δ↓ oracle is trained beside it.
    third = upgrade(project.params, new_model=str(candidate))
    assert third["model_key"] == "bct/gen2"
    assert trained == [
        "models/sequential/bct/gen1",
        "models/sequential/independent/gen1",
        "models/sequential/independent/gen2",
    ]

    registry = registry_of(project)
    versions = registry.versions()
    assert [v.model_key for v in versions] == ["gen0", "bct/gen1", "bct/gen2"]
    assert [v.tags["strategy"] for v in versions] == ["adopted", "bct", "adopted"]
    assert [v.parent_version for v in versions] == [None, versions[0].version, versions[1].version]
    assert versions[2].tags["adopted.source"] == str(tmp_path / "production-1.pt")
    # Evaluated and gated against the champion like a trained generation, its head beside it.
    assert versions[2].tags["gates.against_version"] == str(versions[0].version)
    assert versions[2].tags["gate.degradation.value"] != "n/a"
    assert versions[2].tags["heads"] == "bct/gen2/bict"
    assert versions[2].tags["head.bct/gen2/bict.new_model"].endswith("sequential/bct/gen2")
    taken = project.work / "models/sequential/bct/gen2"
    assert read_model_card(taken) == read_model_card(candidate)
    assert (project.work / "embeddings/sequential/bct/gen2/gallery.npy").is_file()
    report = (project.work / "reports/upgrade-gen2.md").read_text()
    assert "| strategy | adopted |" in report and "unknown: adopted from" in report

    # The store follows the champion: the adopted gen0, then the adopted gen2 by a backfill.
    assert backfill(project.params)["outcome"] == "created, serving gen0"
    promote(registry, versions[2].version, "test: the adopted candidate serves", force=True)
    moved = backfill(project.params)
    assert moved["outcome"] == "backfilled gen0 → gen2"
    assert moved["store_status"]["items_by_space"] == {"gen2": 16}


def test_a_candidate_of_another_dimension_is_gated_through_the_head_trained_to_reach_it(
    harness,  # noqa: F811
    template_db,
    tmp_path,
    monkeypatch,
):
    """Issue 31, item 8: an adopted 16-d candidate after an 8-d champion. The cycle's head
    (flows.heads: BiCT, ψ from the champion's space into the candidate's) is the only way its
    queries reach the stored gallery: the gates must measure M(new, ψ(champion)) and its negative
    flips, not call them unmeasured, and no compatibility score may stand on cells never
    measured."""
    from flows.upgrade import upgrade

    project = make_project(tmp_path, template_db, monkeypatch)
    params = yaml.safe_load(Path(project.params).read_text())
    params["store"]["policy"] = "random"
    Path(project.params).write_text(yaml.safe_dump(params))
    production, candidate = adopted_resnet(tmp_path, 0), adopted_resnet(tmp_path, 1, width=16)
    assert upgrade(project.params, new_model=str(production))["model_key"] == "gen0"
    outcome = upgrade(project.params, new_model=str(candidate))
    version = registry_of(project).versions()[-1]
    tags = version.tags
    assert tags["head.bct/gen1/bict.dims"] == "8->16" and tags["strategy"] == "adopted"
    assert tags["gate.compatibility.value"] != "n/a", tags["gate.compatibility"]
    assert tags["gate.compatibility"].split(":", 1)[1].strip().startswith("M(new, champion)=")
    assert tags["gate.negative_flips.value"] != "n/a", tags["gate.negative_flips"]
    assert set(outcome["failed_gates"]) <= {"compatibility", "negative_flips", "degradation"}
    report = Path(outcome["report"]).read_text()
    assert "| gen1 | bict(gen0) |" in report
    # The direct cell (16-d queries, 8-d gallery) was never measured: no AC stands on it.
    assert "AC(<) –, AC(≤) –" in report


def test_the_upgrade_flow_takes_the_new_model_on_its_command_line(capsys):
    from flows.upgrade import main

    with pytest.raises(SystemExit) as shown:
        main(["--help"])
    assert shown.value.code == 0 and "--new-model" in capsys.readouterr().out
