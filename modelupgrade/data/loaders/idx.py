"""IDX directories: Fashion-MNIST (the default), MNIST, KMNIST, EMNIST and
any other IDX pair set."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from modelupgrade.data.idx_format import read_idx
from modelupgrade.data.loaders.base import LOADERS, DatasetLoader, array_files_manifest, gather_rows
from modelupgrade.data.manifest import class_names_for, contiguous_labels
from modelupgrade.errors import UserError

if TYPE_CHECKING:
    import torch

_IMAGES = re.compile(r"^(?P<prefix>.*?)[-_.]?images[-_.]idx3[-_.]ubyte(\.gz)?$")
_LABELS_SUFFIXES = ("labels-idx1-ubyte.gz", "labels-idx1-ubyte")


def source_split_of(prefix: str) -> str:
    """train/test from a file-name prefix: "train", "t10k", "emnist-letters-test" and the like."""
    tail = re.split(r"[-_.]", prefix)[-1] if prefix else ""
    if tail == "train":
        return "train"
    if tail in ("t10k", "test"):
        return "test"
    return prefix or "train"


@LOADERS.register("idx")
class IdxLoader(DatasetLoader):
    def missing_hint(self) -> str:
        return (
            "run `make dataset` (it runs `sudo apt-get install dataset-fashion-mnist`), or point "
            "dataset.root in params.yaml at a directory of IDX files (MNIST, KMNIST, EMNIST, ...)"
        )

    def file_pairs(self) -> list[tuple[str, Path, Path]]:
        """(source split, images file, labels file) for every images file in the root."""
        root = self.require_root()
        pairs = []
        for images in sorted(root.iterdir()):
            match = _IMAGES.match(images.name)
            if not match:
                continue
            prefix = match.group("prefix")
            joiner = images.name[len(prefix) : len(prefix) + 1] if prefix else ""
            candidates = [root / f"{prefix}{joiner}{suffix}" for suffix in _LABELS_SUFFIXES]
            labels = next((c for c in candidates if c.is_file()), None)
            if labels is None:
                raise UserError(
                    f"IDX images file {images} has no labels file next to it "
                    f"(looked for {', '.join(c.name for c in candidates)})"
                )
            pairs.append((source_split_of(prefix), images, labels))
        if not pairs:
            raise UserError(
                f"no IDX images files (*-images-idx3-ubyte[.gz]) in {root}",
                hint=self.missing_hint(),
            )
        splits = [p[0] for p in pairs]
        if len(set(splits)) != len(splits):
            raise UserError(f"{root} holds several IDX images files for the same split: {splits}")
        return pairs

    def build_manifest(self) -> pd.DataFrame:
        parts = []
        for split, images_file, labels_file in self.file_pairs():
            images = read_idx(images_file)
            labels = read_idx(labels_file)
            if images.ndim != 3 or images.dtype != np.uint8:
                raise UserError(
                    f"IDX images file {images_file} must hold uint8 images (N, H, W); "
                    f"got {images.dtype} {images.shape}"
                )
            if labels.ndim != 1 or len(labels) != len(images):
                raise UserError(
                    f"IDX labels file {labels_file} has a size mismatch: {labels.shape} labels for "
                    f"{len(images)} images in {images_file.name}"
                )
            parts.append((split, images_file.name, labels.astype(np.int64)))
        keys, key_names = contiguous_labels(np.concatenate([p[2] for p in parts]))
        names = class_names_for(self.params.name, self.params.class_names, key_names)
        return array_files_manifest(
            parts, keys, names, id_digits=len(str(max(len(p[2]) for p in parts)))
        )

    def read_images(self, frame: pd.DataFrame) -> torch.Tensor:
        import torch

        paths = frame["path"].astype(str).unique()
        arrays = {p: read_idx(self.resolve(p)) for p in paths}
        if not arrays:
            height, width = read_idx(self.file_pairs()[0][1]).shape[1:]
            return torch.empty((0, 1, height, width), dtype=torch.uint8)
        pixels = gather_rows(arrays, frame)
        return torch.from_numpy(pixels).unsqueeze(1)
