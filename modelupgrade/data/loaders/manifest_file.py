"""A user's CSV or parquet manifest with columns ``path,label[,split][,item_id]`` (paths relative
to root). The ``item_id`` column, when there, names each image (the ids a team's systems know it
by); without it an image's path is its id."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from modelupgrade.data.loaders.base import LOADERS, DatasetLoader, read_image_files
from modelupgrade.data.manifest import class_names_for, contiguous_labels, make_manifest
from modelupgrade.errors import UserError

if TYPE_CHECKING:
    import torch


# Labels that spreadsheets and pandas write for a missing value.
MISSING_MARKERS = frozenset({"nan", "null", "none", "n/a", "<na>"})


@LOADERS.register("manifest")
class ManifestFileLoader(DatasetLoader):
    def table_path(self) -> Path:
        root = self.require_root()
        path = Path(self.params.manifest_file)
        return path if path.is_absolute() else root / path

    def read_table(self) -> pd.DataFrame:
        path = self.table_path()
        if not path.is_file():
            raise UserError(
                f"manifest file {path} does not exist",
                hint="set dataset.manifest_file (relative to dataset.root) to "
                "your CSV or parquet file",
            )
        try:
            if path.suffix.lower() == ".parquet":
                table = pd.read_parquet(path)
            else:
                table = pd.read_csv(
                    path,
                    dtype={"path": str, "split": str, "item_id": str},
                    keep_default_na=False,
                    na_values=[""],
                )
        except (ValueError, OSError, pd.errors.ParserError) as err:
            raise UserError(f"manifest file {path} cannot be read ({err})") from None
        missing = [c for c in ("path", "label") if c not in table.columns]
        if missing:
            raise UserError(
                f"manifest file {path} lacks the column(s) {missing}",
                hint="the columns are path,label and optionally split and item_id",
            )
        for column in ("path", "label", *(["item_id"] if "item_id" in table.columns else [])):
            empty = table[column].isna()
            if empty.any():
                rows = ", ".join(str(i + 2) for i in np.flatnonzero(empty.to_numpy())[:5])
                raise UserError(f"manifest file {path} has empty {column!r} values (lines {rows})")
        # A spreadsheet's missing value written out as text would otherwise become a class.
        missing_like = table["label"].astype(str).str.strip().str.lower().isin(MISSING_MARKERS)
        if missing_like.any():
            lines = np.flatnonzero(missing_like.to_numpy())[:5]
            shown = ", ".join(f"{i + 2} ({table['label'].iloc[i]!r})" for i in lines)
            raise UserError(
                f"manifest file {path} has {int(missing_like.sum())} label(s) that mark a missing "
                f"value, not a class (lines {shown})",
                hint="give those images their class, or drop their lines",
            )
        return table

    def build_manifest(self) -> pd.DataFrame:
        table = self.read_table()
        labels, key_names = contiguous_labels(table["label"])
        names = class_names_for(self.params.name, self.params.class_names, key_names)
        if "split" in table.columns:
            splits = (
                table["split"].fillna(self.params.train_split).astype(str).to_numpy(dtype=object)
            )
        else:
            splits = self.params.train_split
        paths = table["path"].astype(str).to_numpy(dtype=object)
        ids = table["item_id"].astype(str).to_numpy(dtype=object) if "item_id" in table else paths
        return make_manifest(
            item_id=ids,
            label=labels,
            class_names=names,
            source_split=splits,
            path=paths,
            index=-1,
        )

    def read_images(self, frame: pd.DataFrame) -> torch.Tensor:
        return read_image_files(self, frame, self.params.image_size)
