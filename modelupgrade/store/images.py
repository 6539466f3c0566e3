"""Where the backfill gets each item's image: decoded per chunk, a bad image isolated per item.

An image source returns the images it could decode as one uint8 array (N, C, H, W) and, for every
item it could not, the reason. One corrupt file never aborts a chunk.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from modelupgrade.store.schema import ItemRow

log = logging.getLogger(__name__)


@dataclass
class LoadedImages:
    images: np.ndarray
    slots: np.ndarray
    failures: dict[int, str] = field(default_factory=dict)


class ImageSource(Protocol):
    def load(self, items: Sequence[ItemRow]) -> LoadedImages: ...


def _stack(decoded: list[tuple[int, np.ndarray]], failures: dict[int, str]) -> LoadedImages:
    """Stack decoded images; one whose shape differs from the majority's is a
    failure, not a crash."""
    if not decoded:
        return LoadedImages(
            np.empty((0, 1, 1, 1), dtype=np.uint8), np.empty(0, dtype=np.int64), failures
        )
    shapes = [image.shape for _, image in decoded]
    common = max(set(shapes), key=shapes.count)
    kept = []
    for slot, image in decoded:
        if image.shape != common:
            failures[slot] = f"image has shape {image.shape}, the others in its chunk {common}"
        else:
            kept.append((slot, image))
    images = np.stack([image for _, image in kept]).astype(np.uint8, copy=False)
    return LoadedImages(images, np.array([slot for slot, _ in kept], dtype=np.int64), failures)


class ImageFileSource:
    """One image file per item (``source_path`` relative to ``root``), decoded with Pillow."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def load(self, items: Sequence[ItemRow]) -> LoadedImages:
        from PIL import Image, UnidentifiedImageError

        decoded: list[tuple[int, np.ndarray]] = []
        failures: dict[int, str] = {}
        for item in items:
            path = self.root / item.source_path
            try:
                with Image.open(path) as image:
                    image.load()
                    array = np.asarray(
                        image.convert("L")
                        if image.mode in ("1", "L", "P", "I;16")
                        else image.convert("RGB")
                    )
            except FileNotFoundError:
                failures[item.slot] = f"image file {path} does not exist"
                continue
            except (UnidentifiedImageError, OSError, ValueError) as err:
                failures[item.slot] = f"cannot decode {path}: {err}"
                continue
            decoded.append(
                (item.slot, array[None] if array.ndim == 2 else array.transpose(2, 0, 1))
            )
        return _stack(decoded, failures)


class ManifestImageSource:
    """Images addressed the manifest way (path + row index) through
    ``modelupgrade.data.load_images``.

    The whole chunk is decoded in one call; if that fails, items are decoded one by one so that the
    broken ones are named and the rest still go through.
    """

    def __init__(self, dataset_params: Any) -> None:
        self.dataset_params = dataset_params

    def _frame(self, items: Sequence[ItemRow]) -> Any:
        import pandas as pd

        return pd.DataFrame(
            {
                "item_id": [item.item_id for item in items],
                "label": [item.label if item.label is not None else -1 for item in items],
                "class_name": ["" for _ in items],
                "source_split": ["" for _ in items],
                "path": [item.source_path for item in items],
                "index": [item.source_index for item in items],
            }
        )

    def _decode(self, items: Sequence[ItemRow]) -> np.ndarray:
        from modelupgrade.data import load_images

        images = load_images(self._frame(items), self.dataset_params)
        return np.asarray(images.numpy() if hasattr(images, "numpy") else images, dtype=np.uint8)

    def load(self, items: Sequence[ItemRow]) -> LoadedImages:
        try:
            images = self._decode(items)
            return LoadedImages(images, np.array([item.slot for item in items], dtype=np.int64))
        except Exception as err:  # noqa: BLE001 - any decoding error is isolated item by item below
            log.warning(
                "decoding a chunk of %d images failed (%s); decoding them one by one",
                len(items),
                err,
            )
        decoded: list[tuple[int, np.ndarray]] = []
        failures: dict[int, str] = {}
        for item in items:
            try:
                decoded.append((item.slot, self._decode([item])[0]))
            except Exception as err:  # noqa: BLE001 - recorded as this item's failure reason
                failures[item.slot] = (
                    f"cannot load image {item.source_path}[{item.source_index}]: {err}"
                )
        return _stack(decoded, failures)
