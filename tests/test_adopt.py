"""Models made elsewhere, adopted as generations (``modelupgrade adopt``), and new models that start
from local pretrained weights. Every source file is written here with timm, torchvision and torch
directly, never through modelupgrade's own saving code."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import timm
import torch
import torchvision
from torch import nn

from modelupgrade.commands.adopt import adopt
from modelupgrade.commands.heads import train_heads
from modelupgrade.commands.store import backfill, store_ingest
from modelupgrade.commands.training import embed, train
from modelupgrade.config import ParamsError
from modelupgrade.errors import UserError
from modelupgrade.models import embed as embed_images
from modelupgrade.models import load_model, read_model_card
from modelupgrade.store import GalleryStore
from modelupgrade.training import build_model
from tests.data_fixtures import TOY_PIXELS, TOY_SPLITS, write_toy_splits
from tests.model_fixtures import resnet10t, toy_scenario_params, train_toy_successor

TIMM_KWARGS = {"channels": [8, 8, 16, 16], "stem_width": 8}
GREY_16 = {"input_size": 16, "channels": 1, "mean": [0.25], "std": [0.5]}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def params_for(adopted: dict[str, Any], dim: int, **architecture: Any) -> Any:
    """A toy scenario whose new architecture has the adopted model's embedding dimension."""
    return toy_scenario_params(
        "new",
        {**resnet10t(embedding_dim=dim), **architecture},
        {"old": adopted},
        {"epochs": 1, "batch_size": 16, "cpu_threads": 1},
        strategies={"bct": {"kind": "bct"}, "regression": {"kind": "regression"}},
        heads={"fct": {"kind": "fct", "hidden_dim": 16, "epochs": 2}},
    )


# ---------------------------------------------------------------- the sources, written directly


def saved_resnet18(path: Path, num_classes: int) -> Path:
    """A seeded torchvision ResNet-18's state dict, saved at ``path``."""
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18(num_classes=num_classes).state_dict(), path)
    return path


def torchvision_resnet(tmp: Path) -> tuple[dict[str, Any], int]:
    """A torchvision classifier whose penultimate features are the embedding: its 5-class fc is
    named as the classifier to drop."""
    options = {
        "path": str(saved_resnet18(tmp / "resnet18.pt", num_classes=5)),
        "network": "resnet18",
        "classifier_layer": "fc",
        "preprocessing": {"input_size": 16},
    }
    return {"kind": "torchvision", "options": options}, 512


def torchvision_fc_embedding(tmp: Path) -> tuple[dict[str, Any], int]:
    """A torchvision ResNet-18 whose 16-d fc is the embedding (as a team trains a retrieval
    model): named as the embedding layer, with its dimension declared."""
    options = {
        "path": str(saved_resnet18(tmp / "resnet18_fc16.pt", num_classes=16)),
        "network": "resnet18",
        "network_kwargs": {"num_classes": 16},
        "embedding_layer": "fc",
        "embedding_dim": 16,
        "preprocessing": {"input_size": 16},
    }
    return {"kind": "torchvision", "options": options}, 16


def timm_with_custom_head(tmp: Path) -> tuple[dict[str, Any], int]:
    torch.manual_seed(0)
    network = timm.create_model(
        "resnet10t", pretrained=False, num_classes=0, in_chans=1, **TIMM_KWARGS
    )
    network.fc = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 7))
    path = tmp / "timm_custom_head.pt"
    # As DataParallel saves it: every key behind "module.".
    torch.save({f"module.{k}": v for k, v in network.state_dict().items()}, path)
    options = {
        "path": str(path),
        "sha256": sha256(path),
        "network": "resnet10t",
        "network_kwargs": TIMM_KWARGS,
        "key_prefix": "module.",
        "classifier_layer": "fc",
        "preprocessing": GREY_16,
    }
    return {"kind": "timm", "options": options}, 16


class SmallEncoder(nn.Module):
    def __init__(self, dim: int = 8, flat: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.linear = nn.Linear(8, dim)
        self.flat = flat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = torch.relu(self.conv(x)).mean(dim=(2, 3))
        out = self.linear(pooled)
        return out if self.flat else out.view(x.shape[0], -1, 2)


def torchscript_file(tmp: Path, flat: bool = True) -> tuple[dict[str, Any], int]:
    torch.manual_seed(0)
    path = tmp / ("encoder.torchscript" if flat else "wrong_shape.torchscript")
    torch.jit.save(torch.jit.trace(SmallEncoder(flat=flat).eval(), torch.zeros(2, 1, 16, 16)), path)
    options = {"path": str(path), "embedding_dim": 8, "preprocessing": GREY_16}
    return {"kind": "torchscript", "options": options}, 8


def exported_program(tmp: Path) -> tuple[dict[str, Any], int]:
    """A ``torch.export`` program traced for a fixed batch of 3 images (modelupgrade embeds in
    other batch sizes)."""
    torch.manual_seed(0)
    path = tmp / "encoder.pt2"
    program = torch.export.export(SmallEncoder().eval(), (torch.zeros(3, 1, 16, 16),))
    torch.export.save(program, path)
    options = {"path": str(path), "embedding_dim": 8, "preprocessing": GREY_16}
    return {"kind": "torch_export", "options": options}, 8


def embeddings_table(tmp: Path, leave_out: tuple[int, ...] = ()) -> tuple[dict[str, Any], int]:
    """Vectors of every toy image (a class direction plus noise), as a parquet table."""
    rng = np.random.default_rng(0)
    rows = [r for r in range(len(TOY_PIXELS)) if r not in leave_out]
    centres = rng.normal(size=(4, 8))
    vectors = centres[[r % 4 for r in rows]] + 0.3 * rng.normal(size=(len(rows), 8))
    path = tmp / "old_vectors.parquet"
    frame = pd.DataFrame({"item_id": [f"i{r}" for r in rows], "embedding": list(vectors)})
    frame.to_parquet(path)
    return {"kind": "embeddings", "options": {"path": str(path)}}, 8


SOURCES = {
    "torchvision-state-dict": torchvision_resnet,
    "torchvision-fc-embedding": torchvision_fc_embedding,
    "torch-export": exported_program,
    "timm-state-dict-custom-head": timm_with_custom_head,
    "torchscript": torchscript_file,
    "embeddings-only": embeddings_table,
}


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_toy_splits(tmp_path, monkeypatch)
    return tmp_path


# ---------------------------------------------------------------- each form, end to end


@pytest.mark.parametrize("form", SOURCES)
def test_an_adopted_model_embeds_trains_a_successor_trains_a_head_and_backfills_the_store(
    form, project, caplog
):
    adopted, dim = SOURCES[form](project)
    params = params_for(adopted, dim)
    card = adopt(params, "old", scenario="toy").card
    gen0 = Path("models/toy/gen0")
    assert read_model_card(gen0) == card and card.embedding_dim == dim
    assert card.adopted.source_sha256 == sha256(Path(adopted["options"]["path"]))
    assert card.classifier is None and "training data and training run" in card.adopted.unknown

    # Embeds: the query and gallery, and the training split the head needs.
    splits = Path("data/splits/toy")
    written = embed(
        params,
        gen0,
        split=[splits / f"{s}.parquet" for s in ("new_train", "query", "gallery")],
        out_dir=Path("embeddings/toy/gen0"),
    ).paths
    vectors = {p.stem: np.load(p) for p in written}
    assert vectors["gallery"].shape == (8, dim)
    np.testing.assert_allclose(np.linalg.norm(vectors["gallery"], axis=1), 1.0, atol=1e-5)
    if form == "embeddings-only":
        table = pd.read_parquet(adopted["options"]["path"])
        expected = np.stack(table["embedding"].to_numpy()[list(TOY_SPLITS["gallery"])])
    else:
        expected = own_forward(form, adopted, TOY_PIXELS[list(TOY_SPLITS["gallery"])])
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(vectors["gallery"], expected, atol=1e-4)

    # A compatible successor, BCT against the synthesised old classifier (said in the log).
    with caplog.at_level(logging.INFO, logger="modelupgrade.strategies.base"):
        successor = train_toy_successor(
            params,
            embed_split=[splits / "new_train.parquet"],
            embed_dir=Path("embeddings/toy/gen1-bct"),
        ).card
    assert "has no classifier" in caplog.text
    assert successor.parent.path == str(gen0) and successor.backward_compatible
    assert np.isfinite(successor.history[-1]["loss_bct"])

    # A head from the adopted space to the successor's, and a store backfilled through it.
    head = train_heads(
        params,
        "fct",
        Path("embeddings/toy/gen0/new_train.npy"),
        Path("embeddings/toy/gen1-bct/new_train.npy"),
        splits / "new_train.parquet",
        Path("heads/toy/fct-bct"),
        new_model=Path("models/toy/gen1-bct"),
        old_model=gen0,
    ).card
    assert head.in_dim == dim
    store = Path("stores/toy")
    store_ingest(
        params,
        splits / "gallery.parquet",
        gen0,
        store=store,
        vectors=Path("embeddings/toy/gen0/gallery.npy"),
        score=(),
    )
    report = backfill(
        params,
        store=store,
        transform_head=Path("heads/toy/fct-bct"),
        space="gen1-bct",
        policy="random",
        progress=False,
    )
    assert report.status == "complete" and report.items_written == 8
    with GalleryStore.open(store) as gallery:
        status = gallery.status()
    assert status.items_by_space.get("gen1-bct") == 8 and not status.items_by_space.get("gen0")
    assert status.serving_space == "gen1-bct"


def own_forward(form: str, adopted: dict[str, Any], images: torch.Tensor) -> np.ndarray:
    """The source network's embeddings of ``images``, computed here without modelupgrade: the
    network rebuilt from its file, the preprocessing done by hand."""
    options = adopted["options"]
    x = images.float() / 255.0
    if form.startswith("torchvision"):
        classes = options.get("network_kwargs", {}).get("num_classes", 5)
        network = torchvision.models.resnet18(num_classes=classes)
        network.load_state_dict(torch.load(options["path"]))
        if form == "torchvision-state-dict":
            network.fc = nn.Identity()
        x = (x.expand(-1, 3, -1, -1) - 0.5) / 0.5
    else:
        if form == "torchscript":
            network = torch.jit.load(options["path"])
        elif form == "torch-export":
            # Traced for 3 images: run on batches of 3, the last one padded.
            network = torch.export.load(options["path"]).module()
            padded = torch.cat([x, torch.zeros(-len(x) % 3, *x.shape[1:])])
            with torch.no_grad():
                out = [network((padded[i : i + 3] - 0.25) / 0.5) for i in range(0, len(x), 3)]
            return torch.cat(out)[: len(x)].numpy().astype(np.float64)
        else:
            network = timm.create_model(
                "resnet10t", pretrained=False, num_classes=0, in_chans=1, **TIMM_KWARGS
            )
            state = torch.load(options["path"])
            network.load_state_dict(
                {k.removeprefix("module."): v for k, v in state.items() if ".fc." not in k}
            )
        x = (x - 0.25) / 0.5
    with torch.no_grad():
        return network.eval()(x).numpy().astype(np.float64)


# ---------------------------------------------------------------- what each form reports or refuses


def test_the_card_records_the_source_its_preprocessing_the_ignored_head_and_what_is_unknown(
    project,
):
    adopted, dim = timm_with_custom_head(project)
    card = adopt(params_for(adopted, dim), "old", out=Path("m")).card.adopted
    assert card.kind == "timm" and card.preprocessing.mean == [0.25]
    assert card.ignored_keys == ["fc.0.bias", "fc.0.weight", "fc.2.bias", "fc.2.weight"]
    adopted, dim = torchvision_resnet(project)
    card = adopt(params_for(adopted, dim), "old", out=Path("tv")).card.adopted
    assert card.preprocessing.channels == 3 and card.preprocessing.std == [0.5, 0.5, 0.5]
    assert card.ignored_keys == ["fc.bias", "fc.weight"]
    assert any(item.startswith("preprocessing.mean") for item in card.unknown)


def test_a_layer_with_weights_is_never_dropped_silently_and_a_declared_dimension_is_held(
    project,
):
    # The case: a torchvision state dict whose 64-d fc is the embedding. Adopting it as
    # a classifier network used to drop fc and give 512-d features with a warning only.
    adopted, _ = torchvision_fc_embedding(project)
    options = adopted["options"]
    options.pop("embedding_layer")
    with pytest.raises(UserError, match=r"would drop with its classifier 'fc': fc.bias \(16,\)"):
        adopt(params_for(adopted, 16), "old", out=Path("m"))
    options["classifier_layer"] = "fc"
    with pytest.raises(UserError, match="gives 512-dimensional embeddings, not the 16 its options"):
        adopt(params_for(adopted, 16), "old", out=Path("m"))
    assert not Path("m").exists()
    # Named as the embedding layer: kept, 16-d, and the summary says so.
    del options["classifier_layer"]
    options["embedding_layer"] = "fc"
    result = adopt(params_for(adopted, 16), "old", out=Path("m"))
    assert result.card.embedding_dim == 16 and result.card.adopted.ignored_keys == []
    assert "16-dimensional embeddings from layer 'fc'" in result.describe()
    # An unknown layer, or both roles at once, are refused with the model's layers named.
    options["embedding_layer"] = "head"
    with pytest.raises(UserError, match="(?s)has no layer 'head'.*avgpool, fc"):
        adopt(params_for(adopted, 16), "old", out=Path("m2"))
    options["classifier_layer"] = "fc"
    with pytest.raises(ParamsError, match="not both"):
        params_for(adopted, 16)


def test_a_timm_network_keeps_its_projection_when_it_is_named_the_embedding_layer(project):
    torch.manual_seed(0)
    network = timm.create_model(
        "resnet10t", pretrained=False, num_classes=24, in_chans=1, **TIMM_KWARGS
    )
    path = project / "timm_projection.pt"
    torch.save(network.state_dict(), path)
    options = {
        "path": str(path),
        "network": "resnet10t",
        "network_kwargs": {**TIMM_KWARGS, "num_classes": 24},
        "embedding_layer": "fc",
        "preprocessing": GREY_16,
    }
    card = adopt(params_for({"kind": "timm", "options": options}, 24), "old", out=Path("m")).card
    assert card.embedding_dim == 24 and card.adopted.embedding_from == "layer 'fc'"
    with torch.no_grad():
        expected = network.eval()((TOY_PIXELS[:3].float() / 255.0 - 0.25) / 0.5).numpy()
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(embed_images(load_model("m"), TOY_PIXELS[:3]), expected, atol=1e-5)


def test_a_file_of_the_other_compiled_form_is_refused_naming_its_kind(project):
    exported, _ = exported_program(project)
    scripted, _ = torchscript_file(project)
    exported["options"]["path"], scripted["options"]["path"] = (
        scripted["options"]["path"],
        exported["options"]["path"],
    )
    with pytest.raises(UserError, match="not a torch.export program.*"):
        adopt(params_for(exported, 8), "old", out=Path("m"))
    with pytest.raises(UserError, match="not a TorchScript file"):
        adopt(params_for(scripted, 8), "old", out=Path("m"))


def test_a_weights_file_that_does_not_fit_its_architecture_is_refused(project):
    adopted, dim = torchvision_resnet(project)
    path = Path(adopted["options"]["path"])
    torch.save(torchvision.models.resnet34(num_classes=5).state_dict(), path)
    with pytest.raises(UserError, match=r"not fit torchvision resnet18: 96 key\(s\) belong to"):
        adopt(params_for(adopted, dim), "old", out=Path("m"))
    torch.save(torchvision.models.resnet50(num_classes=5).state_dict(), path)
    with pytest.raises(
        UserError, match=r"of another shape .*layer1.0.conv1.weight \(64, 64, 1, 1\)"
    ):
        adopt(params_for(adopted, dim), "old", out=Path("m"))
    assert not Path("m").exists()
    adopted, dim = timm_with_custom_head(project)
    adopted["options"]["key_prefix"] = ""
    adopted["options"].pop("sha256")
    with pytest.raises(UserError, match=r"\d+ missing key\(s\): conv1"):
        adopt(params_for(adopted, dim), "old", out=Path("m"))
    adopted["options"]["sha256"] = "0" * 64
    with pytest.raises(UserError, match="has sha256"):
        adopt(params_for(adopted, dim), "old", out=Path("m"))


def test_a_torchscript_file_with_the_wrong_output_shape_is_refused(project):
    adopted, dim = torchscript_file(project, flat=False)
    with pytest.raises(UserError, match=r"returns \(2, 4, 2\) for a batch of 2 images"):
        adopt(params_for(adopted, dim), "old", out=Path("m"))
    adopted, dim = torchscript_file(project)
    adopted["options"]["embedding_dim"] = 16
    with pytest.raises(UserError, match="gives 8-dimensional embeddings, not the 16"):
        adopt(params_for(adopted, dim), "old", out=Path("m"))
    assert not Path("m").exists()


def test_an_embeddings_table_with_missing_items_is_refused_naming_how_many_and_which_split(
    project,
):
    adopted, dim = embeddings_table(project, leave_out=(65, 66, 70))
    with pytest.raises(UserError, match=r"lack 3 of the 8 images of split query \(i65, i66, i70\)"):
        adopt(params_for(adopted, dim), "old", scenario="toy")
    assert not Path("models/toy/gen0").exists()


def test_a_strategy_that_runs_the_old_model_refuses_an_embeddings_only_one(project):
    adopted, dim = embeddings_table(project)
    params = params_for(adopted, dim)
    adopt(params, "old", scenario="toy")
    with pytest.raises(UserError, match="'regression' runs the old model on every training batch"):
        train(params, scenario="toy", generation=1, strategy="regression", progress=False)
    with pytest.raises(UserError, match="cannot embed images"):
        load_model("models/toy/gen0")(TOY_PIXELS[:2])


def test_an_unknown_source_kind_or_option_is_a_params_error():
    adopted = {"kind": "onnx", "options": {"path": "x"}}
    with pytest.raises(ParamsError, match=r"adopted.old.kind: unknown model source 'onnx'"):
        params_for(adopted, 8)
    adopted = {"kind": "torchscript", "options": {"path": "x", "preprocesing": {}}}
    with pytest.raises(ParamsError, match=r"adopted.old.options.preprocesing: unknown key"):
        params_for(adopted, 8)


def test_an_adopted_model_round_trips_and_refuses_replaced_files(project):
    adopted, dim = torchscript_file(project)
    adopt(params_for(adopted, dim), "old", out=Path("m"))
    model = load_model("m")
    first = embed_images(model, TOY_PIXELS[:4])
    np.testing.assert_allclose(embed_images(load_model("m"), TOY_PIXELS[:4]), first)
    Path("m/network.torchscript").write_bytes(Path(adopted["options"]["path"]).read_bytes() + b"x")
    with pytest.raises(UserError, match="sha256 differs"):
        load_model("m")


# ---------------------------------------------------------------- a new model from weights you hold


def timm_backbone_file(tmp: Path, channels: tuple[int, ...] = (8, 8, 8, 8)) -> Path:
    torch.manual_seed(1)
    network = timm.create_model(
        "resnet10t",
        pretrained=False,
        num_classes=3,
        in_chans=1,
        channels=list(channels),
        stem_width=channels[0],
    )
    path = tmp / "backbone.pt"
    torch.save(network.state_dict(), path)
    return path


def test_a_new_model_starts_from_a_local_pretrained_file_and_its_card_says_so(project):
    path = timm_backbone_file(project)
    architecture = {"pretrained": {"path": str(path), "sha256": sha256(path)}}
    params = params_for(embeddings_table(project)[0], 8, **architecture)
    images, labels = TOY_PIXELS[:32], torch.arange(32) % 4
    model = build_model(params.architectures["new"], images, labels)
    held = torch.load(path)
    for name, tensor in model.backbone.state_dict().items():
        assert torch.equal(tensor, held[name]), name
    adopt(params, "old", scenario="toy")
    card = train(params, scenario="toy", generation=1, strategy="bct", progress=False).card
    assert card.initialised_from["sha256"] == sha256(path)
    assert card.initialised_from["ignored_keys"] == ["fc.bias", "fc.weight"]
    assert card.architecture.pretrained.path == str(path)
    assert "pretrained" not in params_for(adopted_none(), 8).architectures["new"].model_dump()


def adopted_none() -> dict[str, Any]:
    return {"kind": "embeddings", "options": {"path": "unused.parquet"}}


def test_a_pretrained_file_of_another_architecture_or_hash_is_refused(project):
    images, labels = TOY_PIXELS[:8], torch.arange(8) % 4
    path = timm_backbone_file(project, channels=(8, 8, 16, 16))
    params = params_for(adopted_none(), 8, pretrained={"path": str(path)})
    with pytest.raises(UserError, match=r"does not fit the resnet10t backbone .*of another shape"):
        build_model(params.architectures["new"], images, labels)
    params = params_for(adopted_none(), 8, pretrained={"path": str(path), "sha256": "a" * 64})
    with pytest.raises(UserError, match="not the a{64} params.yaml expects"):
        build_model(params.architectures["new"], images, labels)
    params = params_for(adopted_none(), 8, pretrained={"path": "nowhere.pt"})
    with pytest.raises(UserError, match="pretrained weights file nowhere.pt does not exist"):
        build_model(params.architectures["new"], images, labels)
