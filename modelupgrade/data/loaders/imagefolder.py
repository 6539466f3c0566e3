"""ImageFolder trees: one folder per class, optionally under split folders (train/, test/, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from modelupgrade.data.loaders.base import (
    IMAGE_EXTENSIONS,
    LOADERS,
    DatasetLoader,
    read_image_files,
)
from modelupgrade.data.manifest import class_names_for, contiguous_labels, make_manifest
from modelupgrade.errors import UserError

if TYPE_CHECKING:
    import torch

SPLIT_FOLDER_NAMES = frozenset({"train", "test", "val", "valid", "validation", "query", "gallery"})


def _images_under(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")
    )


@LOADERS.register("imagefolder")
class ImageFolderLoader(DatasetLoader):
    """``root/<class>/<image>`` or ``root/<split>/<class>/<image>`` when every
    top folder is a split."""

    def split_folders(self) -> list[tuple[str, Path]]:
        root = self.require_root()
        tops = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        if tops and all(p.name in SPLIT_FOLDER_NAMES for p in tops):
            return [(p.name, p) for p in tops]
        return [(self.params.train_split, root)]

    def build_manifest(self) -> pd.DataFrame:
        root = self.root
        rows: list[tuple[str, str, str]] = []
        for split, folder in self.split_folders():
            for class_dir in sorted(
                p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")
            ):
                for image in _images_under(class_dir):
                    rows.append((split, class_dir.name, image.relative_to(root).as_posix()))
        if not rows:
            raise UserError(
                f"no images in class folders under {root}",
                hint="lay the images out as <root>/<class>/<image> (or "
                "<root>/<split>/<class>/<image>)",
            )
        splits, class_keys, paths = (list(col) for col in zip(*rows, strict=True))
        labels, key_names = contiguous_labels(pd.Series(class_keys, dtype=object))
        names = class_names_for(self.params.name, self.params.class_names, key_names)
        return make_manifest(
            item_id=self.item_ids(paths),
            label=labels,
            class_names=names,
            source_split=np.asarray(splits, dtype=object),
            path=np.asarray(paths, dtype=object),
            index=-1,
        )

    def item_ids(self, paths: list[str]) -> list[str]:
        """Each image's item id by ``dataset.item_ids``: its relative path, or its file stem."""
        if self.params.item_ids == "path":
            return paths
        stems = [Path(path).stem for path in paths]
        seen: dict[str, str] = {}
        for stem, path in zip(stems, paths, strict=True):
            if stem in seen:
                raise UserError(
                    f"two images have the file name {stem!r}: {seen[stem]} and {path}, so "
                    "dataset.item_ids: stem cannot name them",
                    hint="rename one, or set dataset.item_ids: path (the relative path is the id)",
                )
            seen[stem] = path
        return stems

    def read_images(self, frame: pd.DataFrame) -> torch.Tensor:
        return read_image_files(self, frame, self.params.image_size)
