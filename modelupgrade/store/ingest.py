"""Filling a store: from an existing embedding table, or by embedding the items' images."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.images import ImageSource
from modelupgrade.store.schema import ItemFailure, ItemRow, ItemSources
from modelupgrade.store.sources import EmbedFn
from modelupgrade.store.spaces import SpaceSpec
from modelupgrade.store.vectors import content_hashes

log = logging.getLogger(__name__)


ITEM_TABLE_SUFFIXES = (".parquet", ".csv")


def read_item_table(path: Path) -> Any:
    """The items table at ``path``: a manifest or split parquet file, or a CSV file with the same
    columns (item_id, path, and optionally index and label); anything else is a UserError."""
    import pandas as pd

    hint = (
        "pass a manifest or split .parquet file, or a .csv with columns item_id,path[,index,label]"
    )
    if not path.is_file():
        raise UserError(f"item table {path} does not exist", hint=hint)
    suffix = path.suffix.lower()
    if suffix not in ITEM_TABLE_SUFFIXES:
        raise UserError(f"item table {path} is neither .parquet nor .csv", hint=hint)
    try:
        if suffix == ".csv":
            # Ids and paths stay text ("007" is not 7); empty cells are missing values.
            frame = pd.read_csv(
                path, dtype={"item_id": str, "path": str}, keep_default_na=False, na_values=[""]
            )
        else:
            frame = pd.read_parquet(path)
    except (ValueError, OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"item table {path} cannot be read: {first_line}", hint=hint) from None
    return _paths_beside_the_table(frame, path)


def _paths_beside_the_table(frame: Any, table: Path) -> Any:
    """A plain table's (no ``index`` column) relative paths that name files beside the table, made
    absolute: a team's own table names its images relative to itself, as ``plan`` and ``adopt``
    read it, and the store must find them again when a backfill re-embeds them. Other rows keep
    their path (an image of the dataset, found under ``dataset.root`` when it is loaded)."""
    if "path" not in frame.columns or "index" in frame.columns:
        return frame
    folder = table.resolve().parent

    def beside(value: object) -> object:
        if not isinstance(value, str) or not value or os.path.isabs(value):
            return value
        candidate = folder / value
        return os.path.normpath(candidate) if candidate.is_file() else value

    return frame.assign(path=[beside(value) for value in frame["path"]])


def item_rows(frame: object, what: str = "the item table") -> tuple[list[str], ItemSources]:
    """The item ids and sources of an items table, after checking its columns and values: an
    item_id and a path on every row, whole-number indices and labels where those columns exist."""
    import pandas as pd

    assert isinstance(frame, pd.DataFrame)
    missing = [column for column in ("item_id", "path") if column not in frame.columns]
    if missing:
        raise UserError(
            f"{what} lacks column(s) {missing}",
            hint="pass a manifest or split parquet file (columns item_id, path, index, label)",
        )
    for column in ("item_id", "path", "index", "label"):
        if column not in frame.columns:
            continue
        values = frame[column]
        bad = values.isna().to_numpy()
        if column in ("index", "label") and not bad.all():
            numbers = pd.to_numeric(values, errors="coerce")
            bad = bad | numbers.isna().to_numpy() | (numbers % 1 != 0).to_numpy()
        if bad.any():
            rows = np.flatnonzero(bad)
            shown = ", ".join(f"{r} ({values.iloc[r]!r})" for r in rows[:5])
            wanted = "a whole number" if column in ("index", "label") else "a value"
            raise UserError(
                f"{what} has {len(rows)} row(s) whose {column!r} is not {wanted}, "
                f"e.g. row(s) {shown}",
                hint=f"give every row its {column}, or drop the rows without one",
            )
    sources = ItemSources(
        paths=frame["path"].astype(str).tolist(),
        indices=_whole(frame, "index"),
        labels=_whole(frame, "label"),
    )
    return frame["item_id"].astype(str).tolist(), sources


def _whole(frame: Any, column: str) -> list[int] | None:
    import pandas as pd

    if column not in frame.columns:
        return None
    return pd.to_numeric(frame[column]).astype("int64").tolist()


def ingest_embedding_table(
    store: GalleryStore,
    frame: object,
    vectors: np.ndarray,
    space: SpaceSpec,
    scores: Mapping[str, np.ndarray] | None = None,
) -> int:
    """Ingest a split/manifest frame whose row i is embedded by ``vectors[i]`` (the
    embeddings convention)."""
    item_ids, sources = item_rows(frame)
    if len(item_ids) != len(vectors):
        raise UserError(
            f"the embedding table has {len(vectors)} rows but the item table {len(item_ids)}",
            hint="embeddings/<scenario>/<model>/<split>.npy rows follow the split file's rows; "
            "pass the matching pair",
        )
    return store.ingest(item_ids, vectors, space, sources, scores)


def ingest_images(
    store: GalleryStore,
    item_ids: Sequence[str],
    sources: ItemSources,
    images: ImageSource,
    embed_fn: EmbedFn,
    space: SpaceSpec,
    scores: Mapping[str, np.ndarray] | None = None,
    batch_size: int = 512,
) -> list[ItemFailure]:
    """Embed the items' images and ingest them, each vector with the hash of the image it was made
    from; returns the items that could not be read (skipped, logged)."""
    rows = [
        ItemRow(i, str(item_id), path, index, label, space.name)
        for i, (item_id, (path, index, label)) in enumerate(
            zip(item_ids, sources.rows(len(item_ids)), strict=True)
        )
    ]
    kept: list[int] = []
    vectors: list[np.ndarray] = []
    content: list[np.ndarray] = []
    skipped: list[ItemFailure] = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        loaded = images.load(batch)
        for position, reason in loaded.failures.items():
            log.warning("item %s not ingested: %s", rows[position].item_id, reason)
            skipped.append(ItemFailure(rows[position].item_id, reason))
        if len(loaded.slots):
            vectors.append(np.asarray(embed_fn(loaded.images), dtype=np.float32))
            content.append(content_hashes(loaded.images))
            kept.extend(int(p) for p in loaded.slots)
    if not kept:
        raise UserError("none of the items' images could be read; nothing was ingested")
    chosen = np.array(kept)
    kept_sources = ItemSources(
        paths=[rows[p].source_path for p in chosen],
        indices=[rows[p].source_index for p in chosen],
        labels=None if sources.labels is None else [sources.labels[p] for p in chosen],
    )
    kept_scores = {kind: np.asarray(values)[chosen] for kind, values in (scores or {}).items()}
    store.ingest(
        [rows[p].item_id for p in chosen],
        np.concatenate(vectors),
        space,
        kept_sources,
        kept_scores,
        content=np.concatenate(content),
    )
    return skipped
