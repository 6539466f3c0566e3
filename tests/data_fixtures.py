"""Tiny datasets the data tests write themselves (IDX, image folders, CIFAR pickles, GLDv2)."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from modelupgrade.config import Params, parse_params


def idx_bytes(array: np.ndarray) -> bytes:
    codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int32): 0x0C}
    header = struct.pack(">BBBB", 0, 0, codes[array.dtype], array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_idx(path: Path, array: np.ndarray, compress: bool = True) -> Path:
    data = idx_bytes(array)
    path.write_bytes(gzip.compress(data, mtime=0) if compress else data)
    return path


def write_idx_dataset(
    root: Path,
    train: int = 40,
    test: int = 20,
    classes: int = 4,
    size: int = 6,
    compress: bool = True,
    seed: int = 0,
    prefix: str = "",
) -> dict[str, np.ndarray]:
    """IDX pairs for train and t10k; labels cycle through the classes."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    arrays = {}
    suffix = ".gz" if compress else ""
    for split, count in (("train", train), ("t10k", test)):
        images = rng.integers(0, 256, size=(count, size, size), dtype=np.uint8)
        labels = (np.arange(count) % classes).astype(np.uint8)
        write_idx(root / f"{prefix}{split}-images-idx3-ubyte{suffix}", images, compress)
        write_idx(root / f"{prefix}{split}-labels-idx1-ubyte{suffix}", labels, compress)
        arrays[f"{split}-images"], arrays[f"{split}-labels"] = images, labels
    return arrays


def write_png(path: Path, colour: tuple[int, int, int], size: tuple[int, int] = (10, 8)) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


def write_cifar100(
    root: Path, train: int = 12, test: int = 6, classes: int = 3, seed: int = 0
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    base = root / "cifar-100-python"
    base.mkdir(parents=True)
    content = {}
    for split, count in (("train", train), ("test", test)):
        data = {
            b"data": rng.integers(0, 256, size=(count, 3072), dtype=np.uint8),
            b"fine_labels": [i % classes for i in range(count)],
            b"filenames": [f"{split}_{i}.png".encode() for i in range(count)],
        }
        (base / split).write_bytes(pickle.dumps(data))
        content[split] = data
    meta = {b"fine_label_names": [f"class{c}".encode() for c in range(classes)]}
    (base / "meta").write_bytes(pickle.dumps(meta))
    return content


def make_params(root: Path | str, **dataset: Any) -> Params:
    """Params for the data tests: all five scenarios, a small minimum of images per class."""
    raw: dict[str, Any] = {
        "seed": 7,
        "dataset": {
            "name": "tiny",
            "loader": "idx",
            "root": str(root),
            "min_images_per_class": 2,
            **dataset,
        },
        "evaluation_split": {"queries_per_class": 2},
        "scenarios": {
            kind: {"kind": kind, "old_fraction": 0.5, "strategies": []}
            for kind in (
                "extended-data",
                "open-data",
                "extended-class",
                "open-class",
                "identical-data",
            )
        },
        "architectures": {"default": {"backbone": "resnet18"}},
        "strategies": {},
        "sequential": {"fractions": [0.25, 0.5, 1.0], "strategies": []},
    }
    return parse_params(raw)


def write_params_yaml(path: Path, params: Params) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(params.model_dump(mode="json")), encoding="utf-8")
    return path


def synthetic_manifest(class_sizes: list[int], test_per_class: int = 3) -> pd.DataFrame:
    """A manifest of an imaginary IDX dataset with the given training images per class."""
    from modelupgrade.data.manifest import make_manifest

    train_labels = np.repeat(np.arange(len(class_sizes)), class_sizes)
    test_labels = np.repeat(np.arange(len(class_sizes)), test_per_class)
    labels = np.concatenate([train_labels, test_labels])
    splits = ["train"] * len(train_labels) + ["test"] * len(test_labels)
    index = np.concatenate([np.arange(len(train_labels)), np.arange(len(test_labels))])
    return make_manifest(
        item_id=[f"{s}-{i}" for s, i in zip(splits, index, strict=True)],
        label=labels,
        class_names=[f"c{c}" for c in range(len(class_sizes))],
        source_split=np.asarray(splits, dtype=object),
        path=np.asarray([f"{s}.idx" for s in splits], dtype=object),
        index=index,
    )


def quadrant_images(count: int, noise_max: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` learnable 1×16×16 uint8 images of 4 classes: each class brightens its own quadrant
    over seeded noise in [0, noise_max)."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(count) % 4
    images = torch.randint(0, noise_max, (count, 1, 16, 16), dtype=torch.uint8, generator=generator)
    for cls in range(4):
        row, col = divmod(cls, 2)
        images[labels == cls, :, row * 8 : row * 8 + 8, col * 8 : col * 8 + 8] = 255
    return images, labels


# The images of the toy scenario's splits (``write_toy_splits``): row i is the image of index i.
TOY_PIXELS = torch.randint(
    0, 256, (80, 1, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
)
TOY_SPLITS = {
    "old_train": range(32),
    "new_train": range(64),
    "query": range(64, 72),
    "gallery": range(72, 80),
}


def write_toy_splits(project: Path, monkeypatch: Any) -> Path:
    """The split files of a scenario "toy" of 4 classes in the pipeline's layout under
    ``project``; the image decoder is replaced so that their images come from TOY_PIXELS."""
    monkeypatch.setattr(
        "modelupgrade.data.load_images",
        lambda frame, dataset: TOY_PIXELS[torch.as_tensor(frame["index"].to_numpy().copy())],
    )
    root = project / "data/splits/toy"
    root.mkdir(parents=True)
    for name, rows in TOY_SPLITS.items():
        pd.DataFrame(
            {
                "item_id": [f"i{r}" for r in rows],
                "label": [r % 4 for r in rows],
                "class_name": [f"c{r % 4}" for r in rows],
                "source_split": "train",
                "path": "x.idx",
                "index": list(rows),
            }
        ).to_parquet(root / f"{name}.parquet")
    return root
