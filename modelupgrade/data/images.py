"""Decoding the pixels of manifest rows, whatever loader built the manifest."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from modelupgrade.config.data import DatasetParams
from modelupgrade.data.loaders import build_loader
from modelupgrade.data.manifest import check_manifest_columns

if TYPE_CHECKING:
    import torch


def build_manifest(dataset_params: DatasetParams) -> pd.DataFrame:
    """The manifest of the dataset configured in params.yaml (reads no pixels where possible)."""
    return build_loader(dataset_params).build_manifest()


def load_images(frame: pd.DataFrame, dataset_params: DatasetParams) -> torch.Tensor:
    """Decode the images of a manifest (or split) frame into a uint8 tensor (N, C, H, W).

    Row order follows ``frame``. Array datasets (IDX, CIFAR pickles) decode each file once per
    process and index it vectorised; file datasets are decoded with PIL and resized to
    ``dataset.image_size``.
    """
    check_manifest_columns(frame, "the frame passed to load_images")
    return build_loader(dataset_params).read_images(frame.reset_index(drop=True))
