"""The train and embed commands (the stages) on tiny synthetic splits (the image decoder is replaced
by a fixture)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import stages.train
from modelupgrade.commands.training import embed as embed_splits
from modelupgrade.commands.training import train
from modelupgrade.config import parse_params
from modelupgrade.models import embed, load_model, read_model_card

PIXELS = torch.randint(
    0, 256, (80, 1, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
)


@pytest.fixture
def params():
    return parse_params(
        {
            "seed": 7,
            "device": "cpu",
            "scenarios": {"toy": {"kind": "extended-data", "strategies": ["bct"]}},
            "architectures": {
                "default": {
                    "backbone": "resnet10t",
                    "backbone_kwargs": {"channels": [8, 8, 8, 8], "stem_width": 8},
                    "cifar_stem": False,
                    "embedding_dim": 8,
                },
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
    monkeypatch.setattr(
        "modelupgrade.data.load_images",
        lambda frame, dataset: PIXELS[torch.as_tensor(frame["index"].to_numpy().copy())],
    )

    def split(rows):
        return pd.DataFrame(
            {
                "item_id": [f"i{r}" for r in rows],
                "label": [r % 4 for r in rows],
                "class_name": [f"c{r % 4}" for r in rows],
                "source_split": "train",
                "path": "x.idx",
                "index": list(rows),
            }
        )

    root = tmp_path / "data/splits/toy"
    root.mkdir(parents=True)
    split(range(32)).to_parquet(root / "old_train.parquet")
    split(range(64)).to_parquet(root / "new_train.parquet")
    split(range(64, 72)).to_parquet(root / "query.parquet")
    split(range(72, 80)).to_parquet(root / "gallery.parquet")
    return root


def test_train_gen0_and_gen1_then_embed_several_splits(params, splits, tmp_path):
    train(params, scenario="toy", generation=0, out=Path("models/toy/gen0"), progress=False)
    card = train(
        params,
        scenario="toy",
        generation=1,
        strategy="bct",
        old=Path("models/toy/gen0"),
        out=Path("models/toy/gen1-bct"),
        progress=False,
    ).card
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
    expected = embed(load_model("models/toy/gen1-bct"), PIXELS[72:80])
    np.testing.assert_allclose(gallery, expected, atol=1e-6)
    assert gallery.dtype == np.float32


def test_stage_errors_are_user_errors_with_exit_code_2(params, splits, capsys, monkeypatch):
    monkeypatch.setattr("modelupgrade.plugins.load_params", lambda path: params)
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

    monkeypatch.setattr("modelupgrade.plugins.load_params", lambda path: params)
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
