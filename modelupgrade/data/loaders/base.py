"""The loader interface: one class per on-disk format, each yielding the one manifest table."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from modelupgrade.config.data import DatasetParams
from modelupgrade.data.manifest import CROP_COLUMNS, make_manifest
from modelupgrade.errors import UserError
from modelupgrade.plugins import Registry

if TYPE_CHECKING:
    import torch

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"})


class DatasetLoader(ABC):
    """Builds the manifest of a dataset and decodes the images that manifest rows point at."""

    registry_name: str

    def __init__(self, params: DatasetParams) -> None:
        self.params = params
        self.root = Path(params.root)

    @abstractmethod
    def build_manifest(self) -> pd.DataFrame:
        """Scan the dataset root (reading no pixels where the format allows) into a manifest."""

    @abstractmethod
    def read_images(self, frame: pd.DataFrame) -> torch.Tensor:
        """Decode the images of ``frame`` (manifest rows) into a uint8 tensor (N, C, H, W)."""

    def require_root(self) -> Path:
        if not self.root.is_dir():
            raise UserError(
                f"dataset directory {self.root} does not exist", hint=self.missing_hint()
            )
        return self.root

    def missing_hint(self) -> str:
        return f"point dataset.root in params.yaml at a copy of the {self.params.name} dataset"

    def resolve(self, relative: str) -> Path:
        """The absolute path of a manifest path, refusing paths that leave the dataset root."""
        root = self.root.resolve()
        full = (root / relative).resolve()
        if not full.is_relative_to(root):
            raise UserError(f"path {relative!r} points outside the dataset root {root}")
        return full


LOADERS: Registry[DatasetLoader] = Registry("dataset loader")


def build_loader(params: DatasetParams) -> DatasetLoader:
    return LOADERS.get(params.loader)(params)


def read_image_files(loader: DatasetLoader, frame: pd.DataFrame, image_size: int) -> torch.Tensor:
    """Decode one image file per row with PIL: RGB, optional crop box, resized to a square."""
    import torch
    from PIL import Image, UnidentifiedImageError

    out = torch.empty((len(frame), 3, image_size, image_size), dtype=torch.uint8)
    has_crop = all(c in frame.columns for c in CROP_COLUMNS)
    crops = frame[list(CROP_COLUMNS)].to_numpy(dtype=np.float64) if has_crop else None
    for row, relative in enumerate(frame["path"].astype(str)):
        full = loader.resolve(relative)
        try:
            with Image.open(full) as opened:
                opened.load()
                image = opened.convert("RGB")
                if crops is not None and not np.isnan(crops[row]).any():
                    left, top, right, bottom = (float(v) for v in crops[row])
                    image = image.crop((left, top, right, bottom))
                image = image.resize((image_size, image_size), Image.Resampling.BILINEAR)
                pixels = np.asarray(image, dtype=np.uint8)
        except FileNotFoundError:
            raise UserError(
                f"image file {full} does not exist", hint="rebuild the manifest"
            ) from None
        except UnidentifiedImageError:
            raise UserError(f"image file {full} is corrupt: not a readable image") from None
        except (OSError, SyntaxError, ValueError) as err:
            raise UserError(f"image file {full} is corrupt or truncated ({err})") from None
        out[row] = torch.from_numpy(pixels.transpose(2, 0, 1).copy())
    return out


def gather_rows(arrays: dict[str, np.ndarray], frame: pd.DataFrame) -> np.ndarray:
    """Pick rows of per-file arrays for ``frame`` (path, index) with vectorised indexing."""
    first = next(iter(arrays.values()))
    out = np.empty((len(frame), *first.shape[1:]), dtype=first.dtype)
    paths = frame["path"].astype(str).to_numpy()
    indices = frame["index"].to_numpy(dtype=np.int64)
    for path, array in arrays.items():
        mask = paths == path
        rows = indices[mask]
        if rows.size and (rows.min() < 0 or rows.max() >= len(array)):
            raise UserError(
                f"the manifest points at row {int(rows.max())} of {path}, which holds {len(array)}",
                hint="the dataset changed since the manifest was built; rerun the prepare stage",
            )
        out[mask] = array[rows]
    return out


def array_files_manifest(
    parts: list[tuple[str, str, np.ndarray]],
    labels: np.ndarray,
    class_names: list[str],
    id_digits: int,
) -> pd.DataFrame:
    """The manifest of a dataset kept as arrays in files: one row per array row.

    ``parts`` lists (source split, file path, that file's labels); item ids are
    ``<split>-<row, zero-padded to id_digits>``; ``labels`` are all labels, in parts order.
    """
    return make_manifest(
        item_id=[f"{split}-{i:0{id_digits}d}" for split, _, lab in parts for i in range(len(lab))],
        label=labels,
        class_names=class_names,
        source_split=np.concatenate(
            [np.full(len(lab), split, dtype=object) for split, _, lab in parts]
        ),
        path=np.concatenate([np.full(len(lab), path, dtype=object) for _, path, lab in parts]),
        index=np.concatenate([np.arange(len(lab), dtype=np.int64) for _, _, lab in parts]),
    )
