"""Tables of images a person hands a command: a sample to plan on, queries to gate a cutover
with, items to ingest.

Two kinds of table are taken, told apart by one column:

- **rows of the manifest** (an ``index`` column): what the prepare and split stages write
  (``data/splits/<scenario>/*.parquet``); each ``path`` is relative to ``dataset.root`` and read
  by the dataset's loader;
- **a plain table** (no ``index`` column): ``item_id``, ``label`` and ``path``, as CSV or
  parquet; each ``path`` is one image file, absolute or relative to the folder the table is in,
  wherever that is (``dataset.root`` plays no part). An optional ``class_name`` column names the
  classes.

Both come back as manifest rows (a plain table's paths made absolute, ``index`` −1), which
``modelupgrade.data.load_images`` decodes: a row whose path is absolute is read as an image file
whatever ``dataset.loader`` is.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from modelupgrade.errors import UserError

PLAIN_HINT = (
    "a plain table has columns item_id, label and path (each path an image file, absolute or "
    "relative to the table's folder); a split file from the split stage works too"
)
_SHOWN = 5


def read_table_file(path: Path, what: str) -> pd.DataFrame:
    """A CSV or parquet table, ids and paths kept as text (``007`` is not 7)."""
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist", hint=PLAIN_HINT)
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            return pd.read_csv(
                path, dtype={"item_id": str, "path": str}, keep_default_na=False, na_values=[""]
            )
        if suffix == ".parquet":
            return pd.read_parquet(path)
    except (ValueError, OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise UserError(f"{what} {path} cannot be read: {err}", hint=PLAIN_HINT) from None
    raise UserError(f"{what} {path} is neither .csv nor .parquet", hint=PLAIN_HINT)


def is_plain(frame: pd.DataFrame) -> bool:
    """Whether ``frame`` is a plain image table (no ``index`` column: one image file a row)."""
    return "index" not in frame.columns


def as_manifest_rows(frame: pd.DataFrame, table: Path, what: str) -> pd.DataFrame:
    """``frame`` as manifest rows: unchanged when it holds some; a plain table's paths resolved
    (absolute, or against ``table``'s folder) and its files checked to exist, ``index`` −1, and
    the manifest's other columns filled in."""
    if not is_plain(frame):
        return frame
    missing = [c for c in ("item_id", "path") if c not in frame.columns]
    if missing:
        raise UserError(f"{what} {table} has no column(s) {missing}", hint=PLAIN_HINT)
    folder = table.resolve().parent
    paths = [os.path.normpath(folder / p) for p in map(Path, frame["path"].astype(str))]
    absent = [p for p in paths if not Path(p).is_file()]
    if absent:
        shown = ", ".join(absent[:_SHOWN]) + (" …" if len(absent) > _SHOWN else "")
        raise UserError(
            f"{len(absent)} of the {len(paths)} image files {what} {table} names do not exist "
            f"({shown})",
            hint="a plain table's relative paths are relative to the folder the table is in; "
            "or give absolute paths",
        )
    rows = frame.copy()
    rows["item_id"] = rows["item_id"].astype(str)
    rows["path"] = pd.Series(paths, index=rows.index, dtype=object)
    rows["index"] = np.int64(-1)
    if "source_split" not in rows.columns:
        rows["source_split"] = ""
    if "label" in rows.columns and "class_name" not in rows.columns:
        rows["class_name"] = rows["label"].astype(str)
    return rows


def whole_labels(frame: pd.DataFrame, table: Path, what: str) -> pd.DataFrame:
    """``frame`` with its ``label`` column checked (a whole number on every row) and made int64."""
    if "label" not in frame.columns:
        raise UserError(f"{what} {table} has no label column", hint=PLAIN_HINT)
    numbers = pd.to_numeric(frame["label"], errors="coerce")
    bad = numbers.isna().to_numpy() | (numbers % 1 != 0).to_numpy()
    if bad.any():
        rows = np.flatnonzero(bad)
        shown = ", ".join(f"{r} ({frame['label'].iloc[r]!r})" for r in rows[:_SHOWN])
        raise UserError(
            f"{what} {table} has {len(rows)} row(s) whose label is not a whole number, e.g. "
            f"row(s) {shown}",
            hint="labels are class numbers; put class names in a class_name column",
        )
    labelled = frame.copy()
    labelled["label"] = numbers.astype(np.int64)
    return labelled


def read_image_rows(path: str | Path, what: str) -> pd.DataFrame:
    """A table of images, labelled or not (a plain table or manifest rows), as manifest rows
    (an unlabelled plain table's ``label`` −1)."""
    path = Path(path)
    frame = read_table_file(path, what)
    if frame.empty:
        raise UserError(f"{what} {path} is empty", hint=PLAIN_HINT)
    rows = as_manifest_rows(frame, path, what)
    if "label" not in rows.columns:
        rows["label"], rows["class_name"] = np.int64(-1), ""
    return rows.reset_index(drop=True)


def read_labelled_images(path: str | Path, what: str, images: bool = True) -> pd.DataFrame:
    """A table of labelled images (a plain table or manifest rows) as manifest rows with int64
    labels and unique item ids; without ``images`` (their vectors are given elsewhere) a table
    of item_id and label alone is enough."""
    path = Path(path)
    frame = read_table_file(path, what)
    if frame.empty:
        raise UserError(f"{what} {path} is empty", hint=PLAIN_HINT)
    needed = ("item_id", "label", "path") if images else ("item_id", "label")
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise UserError(f"{what} {path} has no column(s) {missing}", hint=PLAIN_HINT)
    repeated = frame["item_id"].astype(str).duplicated()
    if repeated.any():
        shown = ", ".join(frame["item_id"].astype(str)[repeated].unique()[:_SHOWN])
        raise UserError(f"{what} {path} names an item more than once: {shown}")
    rows = as_manifest_rows(frame, path, what) if images else frame
    return whole_labels(rows, path, what).reset_index(drop=True)
