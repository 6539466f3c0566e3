"""Decoding the pixels of manifest rows, whatever loader built the manifest."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from modelupgrade.config.data import DatasetParams
from modelupgrade.data.loaders import build_loader
from modelupgrade.data.loaders.base import read_image_paths
from modelupgrade.data.manifest import check_manifest_columns
from modelupgrade.errors import UserError

if TYPE_CHECKING:
    import torch


def build_manifest(dataset_params: DatasetParams) -> pd.DataFrame:
    """The manifest of the dataset configured in params.yaml (reads no pixels where possible)."""
    return build_loader(dataset_params).build_manifest()


def load_images(frame: pd.DataFrame, dataset_params: DatasetParams) -> torch.Tensor:
    """Decode the images of a manifest (or split) frame into a uint8 tensor (N, C, H, W).

    Row order follows ``frame``. Array datasets (IDX, CIFAR pickles) decode each file once per
    process and index it vectorised; file datasets are decoded with PIL and resized to
    ``dataset.image_size``. A row whose path is absolute (``index`` −1) is an image file read
    as such, whatever the loader: a plain table's image anywhere
    (``modelupgrade.data.image_table``).
    """
    check_manifest_columns(frame, "the frame passed to load_images")
    frame = frame.reset_index(drop=True)
    files = image_file_rows(frame)
    if not files.any():
        return build_loader(dataset_params).read_images(frame)
    paths = [Path(p) for p in frame["path"].astype(str)]
    if files.all():
        return read_image_paths(paths, frame, dataset_params.image_size)
    import torch

    read = read_image_paths(
        [p for p, f in zip(paths, files, strict=True) if f], frame[files], dataset_params.image_size
    )
    rest = build_loader(dataset_params).read_images(frame[~files].reset_index(drop=True))
    if read.shape[1:] != rest.shape[1:]:
        raise UserError(
            f"the frame mixes image files ({tuple(read.shape[1:])}) with images of the dataset "
            f"({tuple(rest.shape[1:])})",
            hint="give one kind of table: a plain one (image files) or rows of the manifest",
        )
    out = torch.empty((len(frame), *read.shape[1:]), dtype=torch.uint8)
    out[torch.from_numpy(files)] = read
    out[torch.from_numpy(~files)] = rest
    return out


def image_file_rows(frame: pd.DataFrame) -> np.ndarray:
    """Which rows of ``frame`` are image files given by an absolute path (``index`` −1)."""
    absolute = np.fromiter(
        (Path(str(p)).is_absolute() for p in frame["path"]), dtype=bool, count=len(frame)
    )
    return absolute & (frame["index"].to_numpy(dtype=np.int64) == -1)
