"""The manifest: one table describing any dataset, whatever its on-disk format.

Columns (the contract every other part relies on): ``item_id`` (unique str), ``label`` (int64,
contiguous 0..C-1), ``class_name`` (str), ``source_split`` (str), ``path`` (str, relative to the
dataset root: the image file, or the IDX/pickle file holding the array) and ``index`` (int64, row
inside that file, -1 when the file holds one image). A loader may add optional columns (GLDv2 adds
the query crop box, the Revisited Oxford/Paris set of each evaluation row and the protocol's ground
truth); split files are rows of the manifest.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from modelupgrade.errors import UserError

MANIFEST_COLUMNS: tuple[str, ...] = (
    "item_id",
    "label",
    "class_name",
    "source_split",
    "path",
    "index",
)

# Crop box of a query image (Revisited Oxford/Paris protocol); NaN when the image is not cropped.
CROP_COLUMNS: tuple[str, ...] = ("crop_left", "crop_top", "crop_right", "crop_bottom")

# Revisited Oxford/Paris: the set a query or gallery row belongs to ("" for rows of no set), and a
# query's ground truth as space-separated gallery item ids of its set (easy, hard, junk).
REVISITED_SET_COLUMN = "revisited_set"
GROUND_TRUTH_COLUMNS: tuple[str, ...] = ("gnd_easy", "gnd_hard", "gnd_junk")

KNOWN_CLASS_NAMES: dict[str, list[str]] = {
    "fashion-mnist": [
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ],
    "mnist": [str(d) for d in range(10)],
}


def contiguous_labels(keys: Sequence[object] | pd.Series) -> tuple[np.ndarray, list[str]]:
    """Map arbitrary class keys to labels 0..C-1 in sorted key order; return (labels, key names).

    Integer keys sort numerically, anything else by its string form, so "10" follows "9" only
    when the keys really are integers.
    """
    series = pd.Series(keys)
    if series.isna().any():
        raise UserError("some class labels are missing (empty)", hint="give every image a label")
    if pd.api.types.is_integer_dtype(series) or pd.api.types.is_bool_dtype(series):
        uniques = np.unique(series.to_numpy(dtype=np.int64))
        labels = np.searchsorted(uniques, series.to_numpy(dtype=np.int64))
        return labels.astype(np.int64), [str(u) for u in uniques]
    as_text = series.astype(str)
    uniques = np.array(sorted(as_text.unique()), dtype=object)
    labels = np.searchsorted(uniques, as_text.to_numpy(dtype=object))
    return labels.astype(np.int64), [str(u) for u in uniques]


def class_names_for(dataset_name: str, configured: list[str] | None, keys: list[str]) -> list[str]:
    """Human-readable names for labels 0..C-1: configured, known for the dataset, or the keys."""
    names = configured if configured is not None else KNOWN_CLASS_NAMES.get(dataset_name)
    if names is None:
        return keys
    if len(names) != len(keys):
        raise UserError(
            f"dataset {dataset_name!r} has {len(keys)} classes but {len(names)} "
            "class names are given",
            hint="fix dataset.class_names in params.yaml (or remove it to use the label values)",
        )
    return list(names)


def make_manifest(
    item_id: Sequence[str] | np.ndarray,
    label: np.ndarray,
    class_names: Sequence[str],
    source_split: Sequence[str] | np.ndarray | str,
    path: Sequence[str] | np.ndarray | str,
    index: np.ndarray | int,
    extra: dict[str, Sequence[object] | np.ndarray] | None = None,
) -> pd.DataFrame:
    """Assemble a manifest with the contract's column order and dtypes; check ids are unique."""
    label = np.asarray(label, dtype=np.int64)
    n = len(label)
    names = np.asarray(class_names, dtype=object)
    frame = pd.DataFrame(
        {
            "item_id": pd.array(np.asarray(item_id, dtype=object), dtype=object),
            "label": label,
            "class_name": names[label] if n else np.array([], dtype=object),
            "source_split": np.broadcast_to(np.asarray(source_split, dtype=object), (n,)).copy(),
            "path": np.broadcast_to(np.asarray(path, dtype=object), (n,)).copy(),
            "index": np.broadcast_to(np.asarray(index, dtype=np.int64), (n,)).copy(),
        }
    )
    for column, values in (extra or {}).items():
        frame[column] = values
    for column in ("item_id", "class_name", "source_split", "path"):
        frame[column] = frame[column].astype(object)
    duplicated = frame["item_id"].duplicated(keep=False)
    if duplicated.any():
        shown = ", ".join(map(str, frame.loc[duplicated, "item_id"].unique()[:5]))
        raise UserError(f"the dataset lists the same item more than once: {shown}")
    return frame


def check_manifest_columns(frame: pd.DataFrame, what: str) -> None:
    missing = [c for c in MANIFEST_COLUMNS if c not in frame.columns]
    if missing:
        raise UserError(
            f"{what} lacks the manifest column(s) {missing}",
            hint="pass a manifest or split file written by the prepare/split stages",
        )


def image_keys(frame: pd.DataFrame) -> pd.Series:
    """One key per underlying image (file, row in file): equal keys mean the same pixels."""
    return frame["path"].astype(str) + "#" + frame["index"].astype(str)


def read_manifest(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"manifest {path} does not exist", hint="run the prepare stage first")
    frame = pd.read_parquet(path)
    check_manifest_columns(frame, str(path))
    return frame
