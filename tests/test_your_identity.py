"""Your identity and one vector format: the ids a team names its images by survive every step
(image folders by file stem, manifests by their item_id column), one ``item_id + embedding``
table is read the same way everywhere, and samples are plain ``item_id, label, path`` tables
whose images may live anywhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from modelupgrade.commands.adopt import adopt
from modelupgrade.commands.data import prepare, split
from modelupgrade.commands.training import embed
from modelupgrade.config import parse_params
from modelupgrade.data import build_manifest, load_images
from modelupgrade.data.image_table import read_labelled_images
from modelupgrade.data.vector_table import read_vector_table, write_vector_table
from modelupgrade.errors import UserError
from modelupgrade.params import check_params
from tests.byo_fixtures import (
    IMAGE_SIZE,
    OLD_DIM,
    sku,
    write_jpeg_folder,
    write_old_state_dict,
    write_plain_table,
)
from tests.data_fixtures import make_params, write_png


def test_an_image_folder_names_its_items_by_file_stem_when_asked(tmp_path):
    rows = write_jpeg_folder(tmp_path / "images", per_class=3)
    dataset = make_params(tmp_path / "images", loader="imagefolder", item_ids="stem").dataset
    manifest = build_manifest(dataset)
    assert sorted(manifest["item_id"]) == sorted(rows["item_id"])
    by_path = make_params(tmp_path / "images", loader="imagefolder").dataset
    assert build_manifest(by_path)["item_id"].iloc[0] == "boots/sku-001000.jpg"
    write_png(tmp_path / "images" / "hats" / "sku-001000.png", (1, 2, 3))
    with pytest.raises(UserError, match="two images have the file name 'sku-001000'"):
        build_manifest(dataset)


def test_a_manifest_file_names_its_items_by_its_item_id_column(tmp_path):
    for i in range(4):
        write_png(tmp_path / f"img/{i}.png", (i * 50, 0, 0))
    pd.DataFrame(
        {
            "path": [f"img/{i}.png" for i in range(4)],
            "label": [0, 1, 0, 1],
            "item_id": ["007", "a", "b", "c"],
        }
    ).to_csv(tmp_path / "manifest.csv", index=False)
    dataset = make_params(tmp_path, loader="manifest").dataset
    assert build_manifest(dataset)["item_id"].tolist() == ["007", "a", "b", "c"]


def test_one_vector_table_in_parquet_list_or_fixed_size_columns_or_npy_with_ids(tmp_path):
    ids = [sku(i) for i in range(5)]
    vectors = np.arange(15, dtype=np.float32).reshape(5, 3)
    fixed = write_vector_table(tmp_path / "fixed.parquet", ids, vectors)
    pd.DataFrame({"item_id": ids, "embedding": list(vectors.astype(np.float64))}).to_parquet(
        tmp_path / "list.parquet"
    )
    np.save(tmp_path / "matrix.npy", vectors)
    pd.DataFrame({"item_id": ids}).to_parquet(tmp_path / "ids.parquet")
    for table in (
        read_vector_table(fixed),
        read_vector_table(tmp_path / "list.parquet"),
        read_vector_table(tmp_path / "matrix.npy", ids=tmp_path / "ids.parquet"),
    ):
        assert table.item_ids == ids and table.vectors.dtype == np.float32
        np.testing.assert_array_equal(table.vectors_of([ids[3], ids[1]], "x"), vectors[[3, 1]])
    with pytest.raises(UserError, match=r"lack 1 of the 2 items of the gallery \(sku-000009\)"):
        table.vectors_of([ids[0], sku(9)], "the gallery")
    ragged = pa.table({"item_id": ["a", "b"], "embedding": [[1.0, 2.0], [1.0, 2.0, 3.0]]})
    pq.write_table(ragged, tmp_path / "ragged.parquet")
    with pytest.raises(UserError, match="not one vector per row of equal length"):
        read_vector_table(tmp_path / "ragged.parquet")
    pd.DataFrame({"item_id": ["a", "a"], "embedding": [[1.0, 2.0]] * 2}).to_parquet(
        tmp_path / "repeat.parquet"
    )
    with pytest.raises(UserError, match="repeat"):
        read_vector_table(tmp_path / "repeat.parquet")
    with pytest.raises(UserError, match="bare matrix"):
        read_vector_table(tmp_path / "matrix.npy")


def test_a_plain_table_reads_images_anywhere_whatever_the_dataset_loader(tmp_path):
    rows = write_jpeg_folder(tmp_path / "photos", per_class=2)
    # The table sits in another folder; its paths are relative to that folder.
    table = write_plain_table(tmp_path / "tables" / "sample.csv", rows)
    frame = read_labelled_images(table, "the sample")
    assert frame["item_id"].tolist() == rows["item_id"].tolist()
    assert frame["path"].tolist() == [str(Path(p).resolve()) for p in rows["path"]]
    # params.yaml points at Fashion-MNIST's IDX files (the default): the images still load.
    dataset = make_params(tmp_path / "no-such-dataset").dataset
    images = load_images(frame, dataset)
    assert images.shape == (len(rows), 3, dataset.image_size, dataset.image_size)
    (tmp_path / "photos" / "hats" / f"{rows['item_id'].iloc[4]}.jpg").unlink()
    with pytest.raises(UserError, match=r"1 of the 8 image files the sample .* do not exist"):
        read_labelled_images(table, "the sample")
    pd.DataFrame({"item_id": ["x"], "label": ["shoes"], "path": [rows["path"].iloc[0]]}).to_csv(
        tmp_path / "named.csv", index=False
    )
    with pytest.raises(UserError, match="label is not a whole number"):
        read_labelled_images(tmp_path / "named.csv", "the sample")


@pytest.mark.parametrize("naming", ["stem", "manifest"])
def test_the_teams_ids_survive_prepare_split_embed_and_adopt(tmp_path, monkeypatch, naming):
    """The issue's case: the old model's vectors keyed by sku ids adopt onto the scenario's
    splits (they failed: "lack 2400 of the 2400 images", the splits named items by path)."""
    monkeypatch.chdir(tmp_path)
    rows = write_jpeg_folder(tmp_path / "images", per_class=12)
    dataset = {"name": "byo", "root": str(tmp_path / "images"), "image_size": IMAGE_SIZE}
    if naming == "stem":
        dataset.update(loader="imagefolder", item_ids="stem")
    else:
        manifest = rows.assign(
            path=[str(Path(p).relative_to(tmp_path / "images")) for p in rows["path"]]
        )
        manifest[["item_id", "path", "label"]].to_csv(tmp_path / "images/list.csv", index=False)
        dataset.update(loader="manifest", manifest_file="list.csv")
    old = write_old_state_dict(tmp_path / "team/old.pt")
    raw = {
        "seed": 5,
        "device": "cpu",
        "dataset": {**dataset, "min_images_per_class": 2},
        "evaluation_split": {"queries_per_class": 3, "holdout_fraction": 0.25},
        "scenarios": {"mine": {"kind": "extended-data", "old_fraction": 0.5, "strategies": []}},
        "study": {"scenarios": ["mine"]},
        "architectures": {"default": {"backbone": "resnet18"}},
        "strategies": {},
        "sequential": {"strategies": []},
        "adopted": {"production": old},
        "registry": {"tracking_uri": "sqlite:///:memory:"},
    }
    params = check_params(parse_params(raw))
    prepare(params)
    split(params, scenario="mine")
    splits = Path("data/splits/mine")
    assert set(pd.read_parquet(splits / "gallery.parquet")["item_id"]) <= set(rows["item_id"])
    # The old model's vectors of every image, as the team keeps them: item_id + embedding.
    every = write_plain_table(tmp_path / "team/all.parquet", rows)
    adopt(params, "production", out=Path("models/production"))
    embed(params, Path("models/production"), split=[every], out=tmp_path / "team/old.parquet")
    table = read_vector_table(tmp_path / "team/old.parquet")
    assert table.item_ids == rows["item_id"].tolist() and table.dim == OLD_DIM
    raw["adopted"]["legacy"] = {
        "kind": "embeddings",
        "options": {"path": str(tmp_path / "team/old.parquet")},
    }
    params = check_params(parse_params(raw))
    card = adopt(params, "legacy", scenario="mine").card
    assert card.embedding_dim == OLD_DIM and card.data["vectors_checked_for"]["gallery"] > 0
