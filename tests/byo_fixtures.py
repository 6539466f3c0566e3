"""A platform team's own upgrade, made here with PIL, torchvision and timm directly (never through
modelupgrade's saving code): a JPEG folder of classes whose files carry the team's ids
(``sku-NNNNNN.jpg``), an old torchvision ResNet-18 whose 16-d ``fc`` is the embedding (a state
dict), a new timm ResNet-10 with a 24-d projection exported as TorchScript, and plain tables of
``item_id, label, path`` kept outside any dataset root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

CLASS_NAMES = ("boots", "dresses", "hats", "shirts")
IMAGE_SIZE = 32
OLD_DIM, NEW_DIM = 16, 24


def sku(number: int) -> str:
    return f"sku-{number:06d}"


def write_jpeg_folder(root: Path, per_class: int = 12, seed: int = 0) -> pd.DataFrame:
    """``root/<class>/sku-NNNNNN.jpg``: each class a colour and a bright quadrant over noise.
    Returns the table of item_id, label, class_name and absolute path, in file order."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    rows = []
    for label, name in enumerate(CLASS_NAMES):
        colour = np.array([(label * 70) % 256, 255 - label * 60, (label * 150) % 256])
        for i in range(per_class):
            pixels = rng.integers(0, 90, (IMAGE_SIZE, IMAGE_SIZE, 3))
            half = IMAGE_SIZE // 2
            row, col = divmod(label, 2)
            pixels[row * half : (row + 1) * half, col * half : (col + 1) * half] = colour
            item = sku(1000 + label * per_class + i)
            path = root / name / f"{item}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels.astype(np.uint8)).save(path, quality=95)
            rows.append({"item_id": item, "label": label, "class_name": name, "path": str(path)})
    return pd.DataFrame(rows)


def write_old_state_dict(path: Path, seed: int = 0) -> dict[str, Any]:
    """A torchvision ResNet-18 whose 16-d fc is the embedding, as a state dict; the adopted
    entry that keeps fc."""
    import torchvision

    torch.manual_seed(seed)
    network = torchvision.models.resnet18(num_classes=OLD_DIM)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(network.state_dict(), path)
    return {
        "kind": "torchvision",
        "options": {
            "path": str(path),
            "network": "resnet18",
            "network_kwargs": {"num_classes": OLD_DIM},
            "embedding_layer": "fc",
            "embedding_dim": OLD_DIM,
            "preprocessing": {"input_size": IMAGE_SIZE},
        },
    }


def write_new_torchscript(path: Path, seed: int = 1) -> dict[str, Any]:
    """A timm ResNet-10 (narrow) with a 24-d projection, traced to TorchScript; its adopted
    entry."""
    import timm

    torch.manual_seed(seed)
    network = timm.create_model(
        "resnet10t", pretrained=False, num_classes=NEW_DIM, channels=[8, 16, 16, 32], stem_width=8
    ).eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    example = torch.zeros(2, 3, IMAGE_SIZE, IMAGE_SIZE)
    torch.jit.save(torch.jit.trace(network, example), path)
    return {
        "kind": "torchscript",
        "options": {
            "path": str(path),
            "embedding_dim": NEW_DIM,
            "preprocessing": {"input_size": IMAGE_SIZE},
        },
    }


def write_plain_table(path: Path, rows: pd.DataFrame, relative: bool = True) -> Path:
    """``rows`` as a plain table of item_id, label and path (relative to ``path``'s folder, or
    absolute)."""
    import os

    table = rows[["item_id", "label", "path"]].copy()
    if relative:
        table["path"] = [os.path.relpath(p, path.parent) for p in table["path"]]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        table.to_csv(path, index=False)
    else:
        table.to_parquet(path, index=False)
    return path
