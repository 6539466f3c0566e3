"""Filling a store: from an existing embedding table, or by embedding the items' images."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np

from modelupgrade.errors import UserError
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.images import ImageSource
from modelupgrade.store.job import EmbedFn
from modelupgrade.store.schema import ItemRow, ItemSources
from modelupgrade.store.spaces import SpaceSpec

log = logging.getLogger(__name__)


def ingest_embedding_table(
    store: GalleryStore,
    frame: object,
    vectors: np.ndarray,
    space: SpaceSpec,
    scores: Mapping[str, np.ndarray] | None = None,
) -> int:
    """Ingest a split/manifest frame whose row i is embedded by ``vectors[i]`` (the
    embeddings convention)."""
    import pandas as pd

    assert isinstance(frame, pd.DataFrame)
    missing = {"item_id", "path"} - set(frame.columns)
    if missing:
        raise UserError(
            f"the item table lacks column(s) {sorted(missing)}",
            hint="pass a manifest or split parquet file",
        )
    if len(frame) != len(vectors):
        raise UserError(
            f"the embedding table has {len(vectors)} rows but the item table {len(frame)}",
            hint="embeddings/<scenario>/<model>/<split>.npy rows follow the split file's rows; "
            "pass the matching pair",
        )
    sources = ItemSources(
        paths=frame["path"].astype(str).tolist(),
        indices=frame["index"].astype(int).tolist() if "index" in frame.columns else None,
        labels=frame["label"].astype(int).tolist() if "label" in frame.columns else None,
    )
    return store.ingest(frame["item_id"].astype(str).tolist(), vectors, space, sources, scores)


def ingest_images(
    store: GalleryStore,
    item_ids: Sequence[str],
    sources: ItemSources,
    images: ImageSource,
    embed_fn: EmbedFn,
    space: SpaceSpec,
    scores: Mapping[str, np.ndarray] | None = None,
    batch_size: int = 512,
) -> list[dict[str, str]]:
    """Embed the items' images and ingest them; returns the items that could not be
    read (skipped, logged)."""
    rows = [
        ItemRow(i, str(item_id), path, index, label, space.name)
        for i, (item_id, (path, index, label)) in enumerate(
            zip(item_ids, sources.rows(len(item_ids)), strict=True)
        )
    ]
    kept: list[int] = []
    vectors: list[np.ndarray] = []
    skipped: list[dict[str, str]] = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        loaded = images.load(batch)
        for position, reason in loaded.failures.items():
            log.warning("item %s not ingested: %s", rows[position].item_id, reason)
            skipped.append({"item_id": rows[position].item_id, "reason": reason})
        if len(loaded.slots):
            vectors.append(np.asarray(embed_fn(loaded.images), dtype=np.float32))
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
        [rows[p].item_id for p in chosen], np.concatenate(vectors), space, kept_sources, kept_scores
    )
    return skipped
