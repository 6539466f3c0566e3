"""The train and embed commands (the stages) on tiny synthetic splits (the image decoder is replaced
by a fixture)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import stages.train
from modelupgrade.commands.training import embed as embed_splits
from modelupgrade.commands.training import train
from modelupgrade.config import parse_params
from modelupgrade.models import embed, load_model, read_model_card
from tests.data_fixtures import TOY_PIXELS, write_toy_splits
from tests.model_fixtures import resnet10t, train_toy_successor


@pytest.fixture
def params():
    return parse_params(
        {
            "seed": 7,
            "device": "cpu",
            "scenarios": {"toy": {"kind": "extended-data", "strategies": ["bct"]}},
            "architectures": {
                "default": resnet10t(),
            },
            "training": {"epochs": 1, "batch_size": 16},
            "strategies": {
                "bct": {"kind": "bct"},
                "uni": {"kind": "unibct", "options": {"warmup_epochs": 0}},
            },
            "sequential": {"strategies": ["bct"]},
        }
    )


@pytest.fixture
def splits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return write_toy_splits(tmp_path, monkeypatch)


def test_train_gen0_and_gen1_then_embed_several_splits(params, splits, tmp_path):
    train(params, scenario="toy", generation=0, out=Path("models/toy/gen0"), progress=False)
    card = train_toy_successor(params, old=Path("models/toy/gen0")).card
    assert card.data["split"].endswith("new_train.parquet") and card.data["images"] == 64
    assert card.seed == 8 and read_model_card("models/toy/gen0").data["images"] == 32
    written = embed_splits(
        params,
        Path("models/toy/gen1-bct"),
        split=[splits / "query.parquet", splits / "gallery.parquet"],
        out_dir=Path("embeddings/toy/gen1-bct"),
    ).paths
    assert [p.name for p in written] == ["query.npy", "gallery.npy"]
    gallery = np.load(written[1])
    expected = embed(load_model("models/toy/gen1-bct"), TOY_PIXELS[72:80])
    np.testing.assert_allclose(gallery, expected, atol=1e-6)
    assert gallery.dtype == np.float32


def test_stage_errors_are_user_errors_with_exit_code_2(params, splits, capsys, monkeypatch):
    monkeypatch.setattr("modelupgrade.params.load_params", lambda path: params)
    with pytest.raises(SystemExit) as exit_info:
        stages.train.main(
            ["--generation", "1", "--scenario", "toy", "--strategy", "nope", "--out", "m"]
        )
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        stages.train.main(["--generation", "0", "--split", "missing.parquet", "--out", "m"])
    err = capsys.readouterr().err
    assert "unknown strategy 'nope'" in err and "missing.parquet does not exist" in err


def test_main_parses_the_cli(params, splits, monkeypatch):
    seen = {}

    class TrainedCard:  # what the stage reads of the card it gets back
        def headline_metrics(self) -> dict[str, float]:
            return {}

        def as_dict(self) -> dict[str, str]:
            return {}

    monkeypatch.setattr("modelupgrade.params.load_params", lambda path: params)
    monkeypatch.setattr(
        "modelupgrade.training.pipeline.train_model", lambda **kw: seen.update(kw) or TrainedCard()
    )
    stages.train.main(
        [
            "--generation",
            "2",
            "--split",
            str(splits / "new_train.parquet"),
            "--strategy",
            "uni",
            "--old",
            "models/seq/gen1",
            "--out",
            "models/seq/uni/gen2",
            "--no-progress",
        ]
    )
    assert seen["architecture_name"] == "default" and seen["strategy_params"].kind == "unibct"
    assert seen["generation"] == 2 and seen["progress"] is False and seen["seed"] == 9
