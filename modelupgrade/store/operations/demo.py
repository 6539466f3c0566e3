"""The demo store of the study (stage ``demo_store``): the gallery ingested with its old vectors and
backfilled with the new model to completion, its summary recorded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from modelupgrade.arrays import load_array
from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.io import write_json
from modelupgrade.json_data import JsonObject
from modelupgrade.serving import build_serving_mode
from modelupgrade.store.backends import BackendSettings
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.operations.backfill import backfill_job
from modelupgrade.store.operations.requests import Chunking
from modelupgrade.store.report import BackfillReport
from modelupgrade.store.search import Searcher


@dataclass(frozen=True)
class DemoRequest:
    """The demo store's inputs: both models, the gallery split, where the store goes."""

    old_model: Path
    new_model: Path
    gallery: Path
    out: Path
    old_embeddings: Path | None = None
    head: Path | None = None
    progress: bool = False


def build_demo_store(
    params: Params, request: DemoRequest, device: str
) -> tuple[JsonObject, BackfillReport]:
    """Build the store at ``request.out`` (absent or empty: DVC removes a stage's output before
    it runs) in place, under its lock, and backfill it; returns its summary and the backfill."""
    from modelupgrade.store.images import ManifestImageSource
    from modelupgrade.store.ingest import ingest_embedding_table, read_item_table
    from modelupgrade.store.models import (
        CLASSIFIER_SCORES,
        model_embed_fn,
        ordering_scores,
        space_for_model,
    )
    from modelupgrade.store.schema import ItemRow
    from modelupgrade.store.sources import ReEmbedImages

    frame = read_item_table(request.gallery)
    old_space = space_for_model(request.old_model, upgrades_from=())
    new_space = space_for_model(request.new_model, upgrades_from=[old_space.name])
    images = ManifestImageSource(params.dataset)
    batch = params.store.embed_batch_size
    if request.old_embeddings is not None:
        old_vectors = load_array(request.old_embeddings, "old gallery embeddings", mmap=False)
    else:
        rows = [
            ItemRow(i, str(r.item_id), str(r.path), int(r.index), None, old_space.name)
            for i, r in enumerate(frame.itertuples(index=False))
        ]
        loaded = images.load(rows)
        if loaded.failures:
            raise UserError(
                f"{len(loaded.failures)} gallery images cannot be read, e.g. "
                f"{next(iter(loaded.failures.values()))}"
            )
        old_vectors = model_embed_fn(request.old_model, batch, device)(loaded.images)
    kinds = [*CLASSIFIER_SCORES, *(["fastfill-sigma2"] if request.head is not None else [])]
    scores = ordering_scores(request.old_model, old_vectors, kinds, request.head)
    with GalleryStore.create(request.out, BackendSettings.of(params.store)) as store:
        ingest_embedding_table(store, frame, old_vectors, old_space, scores)
        source = ReEmbedImages(images, model_embed_fn(request.new_model, batch, device))
        chunking = Chunking.of(params, None, None, None)
        report = backfill_job(store, new_space, source, chunking, request.progress).run()
        if report.status != "complete":
            raise UserError(
                f"the demo backfill ended with status {report.status!r}", hint="run the stage again"
            )
        summary: JsonObject = {
            "store": str(request.out),
            "items": store.item_count(),
            "old_space": old_space.name,
            "new_space": new_space.name,
            "policy": params.store.policy,
            "chunk_size": params.store.chunk_size,
            "backfill": report.as_dict(),
            "status": store.status().as_dict(),
            "self_retrieval_top1": _self_found(store, params, new_space.name, frame, report),
            "device": device,
        }
    write_json(request.out / "summary.json", summary)
    return summary, report


def _self_found(
    store: GalleryStore, params: Params, space: str, frame: Any, report: BackfillReport
) -> float | None:
    """Sanity check: an item's own new vector must find that item first."""
    if report.failed:
        return None
    probe = np.arange(min(5, store.item_count()))
    hits = Searcher(store, build_serving_mode("mixed"), params.store.distance).search(
        store.read_vectors(space, probe), 1
    )
    return float(np.mean(hits.item_ids[:, 0] == frame["item_id"].astype(str).to_numpy()[probe]))
