"""Every loader on small datasets the tests write themselves; corrupt input gets a clear error."""

from __future__ import annotations

import gzip
import pickle

import numpy as np
import pandas as pd
import pytest

from modelupgrade.config.errors import ParamsError
from modelupgrade.data import MANIFEST_COLUMNS, build_manifest, load_images
from modelupgrade.data.idx_format import clear_cache
from modelupgrade.data.manifest import KNOWN_CLASS_NAMES
from modelupgrade.errors import UserError
from modelupgrade.params import check_params
from tests.data_fixtures import (
    idx_bytes,
    make_params,
    write_cifar100,
    write_idx,
    write_idx_dataset,
    write_png,
)


@pytest.fixture(autouse=True)
def _fresh_idx_cache():
    clear_cache()
    yield
    clear_cache()


def check_contract(manifest: pd.DataFrame) -> None:
    assert list(manifest.columns[: len(MANIFEST_COLUMNS)]) == list(MANIFEST_COLUMNS)
    assert manifest["label"].dtype == np.int64 and manifest["index"].dtype == np.int64
    assert manifest["item_id"].is_unique
    assert sorted(manifest["label"].unique()) == list(range(manifest["class_name"].nunique()))
    assert manifest.groupby("label")["class_name"].nunique().max() == 1


@pytest.mark.parametrize("compress", [True, False])
def test_idx_manifest_and_pixels(tmp_path, compress):
    arrays = write_idx_dataset(tmp_path, train=30, test=10, classes=3, compress=compress)
    dataset = make_params(tmp_path).dataset
    manifest = build_manifest(dataset)
    check_contract(manifest)
    assert manifest.groupby("source_split").size().to_dict() == {"test": 10, "train": 30}
    assert list(manifest["class_name"].unique()[:3]) == ["0", "1", "2"]
    shuffled = manifest.sample(frac=1.0, random_state=3)
    images = load_images(shuffled, dataset)
    assert images.shape == (40, 1, 6, 6) and str(images.dtype) == "torch.uint8"
    for row, image in zip(shuffled.itertuples(), images, strict=True):
        source = arrays["train-images" if row.source_split == "train" else "t10k-images"]
        np.testing.assert_array_equal(image[0].numpy(), source[row.index])


def test_idx_fashion_mnist_class_names_and_other_prefixes(tmp_path):
    write_idx_dataset(tmp_path, classes=10, prefix="emnist-balanced-")
    manifest = build_manifest(make_params(tmp_path, name="fashion-mnist").dataset)
    assert set(manifest["source_split"]) == {"train", "test"}
    assert (
        manifest.drop_duplicates("label").sort_values("label")["class_name"].tolist()
        == (KNOWN_CLASS_NAMES["fashion-mnist"])
    )


def test_missing_dataset_says_how_to_install(tmp_path):
    with pytest.raises(UserError) as err:
        build_manifest(make_params(tmp_path / "absent").dataset)
    text = str(err.value)
    assert "does not exist" in text and "make dataset" in text
    assert "apt-get install dataset-fashion-mnist" in text and "dataset.root" in text


def test_empty_idx_directory(tmp_path):
    with pytest.raises(UserError, match="no IDX images files"):
        build_manifest(make_params(tmp_path).dataset)


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda data: b"\x08\x03" + data[2:], "bad magic number"),
        (lambda data: data[:-7], "truncated"),
        (lambda data: data + b"\x00" * 5, "size mismatch"),
        (lambda data: data[:3], "truncated"),
    ],
    ids=["magic", "truncated-data", "trailing-bytes", "truncated-header"],
)
def test_corrupt_idx_names_file_and_problem(tmp_path, corrupt, message):
    write_idx_dataset(tmp_path, compress=False)
    broken = tmp_path / "train-images-idx3-ubyte"
    broken.write_bytes(corrupt(broken.read_bytes()))
    with pytest.raises(UserError, match=message) as err:
        build_manifest(make_params(tmp_path).dataset)
    assert str(broken) in str(err.value)


def test_truncated_gzip_and_label_count_mismatch(tmp_path):
    write_idx_dataset(tmp_path)
    images = tmp_path / "train-images-idx3-ubyte.gz"
    images.write_bytes(images.read_bytes()[:-30])
    with pytest.raises(UserError, match="truncated: the gzip stream ends early"):
        build_manifest(make_params(tmp_path).dataset)
    write_idx_dataset(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(3, dtype=np.uint8))
    with pytest.raises(UserError, match="size mismatch: \\(3,\\) labels for 40 images"):
        build_manifest(make_params(tmp_path).dataset)


def test_idx_cache_rereads_a_changed_file(tmp_path):
    write_idx_dataset(tmp_path)
    dataset = make_params(tmp_path).dataset
    manifest = build_manifest(dataset)
    train_rows = manifest[manifest["source_split"] == "train"].iloc[:5]
    first = load_images(train_rows, dataset)
    # The cache keys on size and mtime: a rewritten file must be decoded again.
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(idx_bytes(np.zeros((40, 6, 6), np.uint8)))
    )
    second = load_images(train_rows, dataset)
    assert first.any() and not second.any()


def test_imagefolder_flat_and_split_layouts(tmp_path):
    colours = {"cat": (255, 0, 0), "dog": (0, 0, 255)}
    for name, colour in colours.items():
        for i in range(3):
            write_png(tmp_path / "flat" / name / f"{i}.png", colour)
            write_png(tmp_path / "split" / "train" / name / f"{i}.png", colour)
        write_png(tmp_path / "split" / "test" / name / "t.png", colour)
    dataset = make_params(tmp_path / "flat", loader="imagefolder", image_size=12).dataset
    manifest = build_manifest(dataset)
    check_contract(manifest)
    assert set(manifest["source_split"]) == {"train"} and (manifest["index"] == -1).all()
    assert manifest.drop_duplicates("label")["class_name"].tolist() == ["cat", "dog"]
    images = load_images(manifest, dataset)
    assert images.shape == (6, 3, 12, 12)
    red = images[manifest["class_name"].to_numpy() == "cat"]
    assert (red[:, 0] == 255).all() and (red[:, 2] == 0).all()
    split_manifest = build_manifest(make_params(tmp_path / "split", loader="imagefolder").dataset)
    assert split_manifest.groupby("source_split").size().to_dict() == {"test": 2, "train": 6}


def test_corrupt_image_file_is_named(tmp_path):
    write_png(tmp_path / "a" / "0.png", (1, 2, 3))
    bad = tmp_path / "a" / "1.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage")
    dataset = make_params(tmp_path, loader="imagefolder").dataset
    with pytest.raises(UserError, match="corrupt") as err:
        load_images(build_manifest(dataset), dataset)
    assert str(bad) in str(err.value)


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_manifest_file_with_string_labels(tmp_path, suffix):
    table = pd.DataFrame(
        {
            "path": [f"img/{i}.png" for i in range(6)],
            "label": ["zebra", "ant", "zebra", "moth", "ant", "moth"],
            "split": ["train", "train", "test", "train", "test", "test"],
        }
    )
    for i, path in enumerate(table["path"]):
        write_png(tmp_path / path, (i * 40, 0, 0))
    if suffix == "csv":
        table.to_csv(tmp_path / "list.csv", index=False)
    else:
        table.to_parquet(tmp_path / "list.parquet", index=False)
    dataset = make_params(
        tmp_path, loader="manifest", manifest_file=f"list.{suffix}", image_size=8
    ).dataset
    manifest = build_manifest(dataset)
    check_contract(manifest)
    assert manifest["label"].tolist() == [2, 0, 2, 1, 0, 1]
    assert manifest["class_name"].tolist() == table["label"].tolist()
    assert manifest["source_split"].tolist() == table["split"].tolist()
    images = load_images(manifest.iloc[[3]], dataset)
    assert images.shape == (1, 3, 8, 8) and int(images[0, 0, 0, 0]) == 120


def test_manifest_file_problems(tmp_path):
    pd.DataFrame({"path": ["a.png"]}).to_csv(tmp_path / "manifest.csv", index=False)
    with pytest.raises(UserError, match="lacks the column"):
        build_manifest(make_params(tmp_path, loader="manifest").dataset)
    pd.DataFrame({"path": ["a.png", "b.png"], "label": ["x", None]}).to_csv(
        tmp_path / "manifest.csv", index=False
    )
    with pytest.raises(UserError, match="empty 'label' values \\(lines 3\\)"):
        build_manifest(make_params(tmp_path, loader="manifest").dataset)


def test_cifar100_pickles(tmp_path):
    content = write_cifar100(tmp_path, train=12, test=6, classes=3)
    dataset = make_params(tmp_path, loader="cifar100").dataset
    manifest = build_manifest(dataset)
    check_contract(manifest)
    assert manifest.groupby("source_split").size().to_dict() == {"test": 6, "train": 12}
    assert manifest.drop_duplicates("label")["class_name"].tolist() == [
        "class0",
        "class1",
        "class2",
    ]
    rows = manifest.iloc[[13, 2, 0]]
    images = load_images(rows, dataset)
    assert images.shape == (3, 3, 32, 32)
    expected = content["test"][b"data"][1].reshape(3, 32, 32)
    np.testing.assert_array_equal(images[0].numpy(), expected)
    (tmp_path / "cifar-100-python" / "test").write_bytes(
        pickle.dumps({b"data": np.zeros((2, 5), np.uint8)})
    )
    with pytest.raises(UserError, match="size mismatch"):
        build_manifest(make_params(tmp_path, loader="cifar100").dataset)


def test_gldv2_with_revisited_ground_truth_and_query_crop(tmp_path):
    from PIL import Image

    ids = {"101": ["abc111", "abd222", "abe333"], "202": ["bcd444", "bce555", "bcf666"]}
    pd.DataFrame({"landmark_id": list(ids), "images": [" ".join(v) for v in ids.values()]}).to_csv(
        tmp_path / "train_clean.csv", index=False
    )
    for image_id in [i for group in ids.values() for i in group]:
        write_png(
            tmp_path / "train" / image_id[0] / image_id[1] / image_id[2] / f"{image_id}.jpg",
            (9, 9, 9),
        )
    jpg = tmp_path / "roxford5k" / "jpg"
    for name in ("all_souls_000001", "all_souls_000002", "radcliffe_000003", "oxford_000004"):
        write_png(jpg / f"{name}.jpg", (0, 0, 0), size=(40, 30))
    query = Image.new("RGB", (40, 30), (0, 0, 0))
    query.paste((0, 255, 0), (10, 5, 30, 25))
    query.save(jpg / "all_souls_000013.jpg", format="PNG")
    gnd = {
        "imlist": ["all_souls_000001", "all_souls_000002", "radcliffe_000003", "oxford_000004"],
        "qimlist": ["all_souls_000013", "radcliffe_camera_000519"],
        "gnd": [
            {"bbx": [10, 5, 30, 25], "easy": [0], "hard": [1], "junk": [3]},
            {"bbx": [0, 0, 20, 20], "easy": [2], "hard": [], "junk": []},
        ],
    }
    (tmp_path / "roxford5k" / "gnd_roxford5k.pkl").write_bytes(pickle.dumps(gnd))
    write_png(jpg / "radcliffe_camera_000519.jpg", (0, 0, 0), size=(40, 30))
    dataset = make_params(
        tmp_path, loader="gldv2", image_size=16, gldv2={"revisited_sets": ["roxford5k"]}
    ).dataset
    manifest = build_manifest(dataset)
    check_contract(manifest)
    assert manifest.groupby("source_split").size().to_dict() == {
        "gallery": 4,
        "query": 2,
        "train": 6,
    }
    queries = manifest[manifest["source_split"] == "query"]
    assert queries["gnd_easy"].tolist() == [
        "roxford5k/gallery/all_souls_000001",
        "roxford5k/gallery/radcliffe_000003",
    ]
    assert queries.iloc[0]["gnd_junk"] == "roxford5k/gallery/oxford_000004"
    # Each evaluation row names its set (the evaluator ranks a set's queries on its gallery only).
    sets = manifest.groupby("source_split")["revisited_set"].agg(set).to_dict()
    assert sets == {"gallery": {"roxford5k"}, "query": {"roxford5k"}, "train": {""}}
    gallery = manifest[manifest["source_split"] == "gallery"].set_index("item_id")["class_name"]
    assert gallery["roxford5k/gallery/all_souls_000002"] == "roxford5k/all_souls"
    assert gallery["roxford5k/gallery/oxford_000004"] == "roxford5k/distractor"
    cropped = load_images(queries.iloc[[0]], dataset)
    assert (cropped[0, 1] == 255).all() and (cropped[0, 0] == 0).all()
    uncropped = load_images(
        manifest[manifest["item_id"] == "roxford5k/gallery/all_souls_000001"], dataset
    )
    assert uncropped.shape == (1, 3, 16, 16) and not uncropped.any()


def test_unknown_loader_is_rejected_by_the_params_check(tmp_path):
    # The config takes the name; the check against the loaders' registry refuses it.
    with pytest.raises(ParamsError, match="dataset.loader"):
        check_params(make_params(tmp_path, loader="tfrecord"))
