"""Tasks over the real gallery store (``modelupgrade.store``): open it on the champion, backfill it.

The store serves the chain's evaluation gallery (``data/splits/sequential/gallery.parquet`` of the
work directory). Each space is named after its model directory (``gen0``, ``gen2``), so the store's
serving space says which generation serves it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from flows.layout import load_settings
from flows.tasks import stage_task


@stage_task("store-state")
def store_state(store: str) -> dict[str, Any] | None:
    """The store's status (serving space, last backfill), None when there is no store yet."""
    from modelupgrade.store import GalleryStore
    from modelupgrade.store.schema import DATABASE_FILE

    if not (Path(store) / DATABASE_FILE).is_file():
        return None
    with GalleryStore.open(store) as gallery:
        return gallery.status().as_dict()


@stage_task("create-store")
def create_store(params_path: str, work_dir: str, store: str, generation: int) -> dict[str, Any]:
    """A new store holding the gallery in the space of ``generation``'s model (its evaluation
    embeddings), with the ordering scores ``store.policy`` needs for later backfills."""
    import numpy as np
    import pandas as pd

    from modelupgrade.io import atomic_path
    from modelupgrade.store import GalleryStore, ingest_embedding_table
    from modelupgrade.store.models import CLASSIFIER_SCORES, ordering_scores, space_for_model

    settings = load_settings(params_path, work_dir)
    work = settings.work
    model_dir = work.model(settings.strategy, generation)
    vectors = np.load(work.embeddings(settings.strategy, generation) / "gallery.npy", allow_pickle=False)
    frame = pd.read_parquet(work.splits / "gallery.parquet")
    space = space_for_model(model_dir, upgrades_from=())
    scores = ordering_scores(model_dir, vectors, CLASSIFIER_SCORES)
    with atomic_path(store) as tmp:
        with GalleryStore.create(tmp) as gallery:
            ingest_embedding_table(gallery, frame, vectors, space, scores)
    with GalleryStore.open(store) as gallery:
        return gallery.status().as_dict()


@stage_task("backfill-store")
def backfill_store(params_path: str, work_dir: str, store: str, generation: int) -> dict[str, Any]:
    """Re-embed every gallery image with ``generation``'s model, chunk by chunk (crash-safe, resumable),
    publishing the progress as the ``backfill-progress`` artifact as chunks commit.

    A backfill left running towards another space (the champion moved again meanwhile) is finished
    first, with the model its space was created from: the store runs one backfill at a time.
    """
    from modelupgrade.runtime import select_device
    from modelupgrade.ordering import build_ordering
    from modelupgrade.store import BackfillJob, GalleryStore, ManifestImageSource, ReEmbedImages
    from modelupgrade.store.models import model_embed_fn, space_for_model

    settings = load_settings(params_path, work_dir)
    params = settings.params
    device = str(select_device(params.device))
    target_model = settings.work.model(settings.strategy, generation)
    reports = []
    with GalleryStore.open(store) as gallery:
        source_space = gallery.snapshot().serving_space
        active = gallery.backfills.active()
        steps = []
        if active is not None and active.target_space != target_model.name:
            steps.append(Path(str(gallery.space(active.target_space).model_ref)))
        steps.append(target_model)
        for model_dir in steps:
            serving = gallery.snapshot().serving_space
            spec = space_for_model(model_dir, upgrades_from=[serving] if serving else None)
            job = BackfillJob(
                gallery, spec,
                ReEmbedImages(ManifestImageSource(params.dataset),
                              model_embed_fn(model_dir, params.store.embed_batch_size, device)),
                build_ordering(params.store.policy), params.store.chunk_size, seed=params.seed, progress=False,
            )
            progress = create_progress_artifact(
                0.0, key="backfill-progress", description=f"{store}: {serving} → {spec.name}"
            )
            chunks_per_update = 1
            while True:
                report = job.run(max_chunks=chunks_per_update)
                state = gallery.status().backfill or {}
                # About 50 progress updates per backfill, however large the gallery.
                chunks_per_update = max(1, -(-state.get("total", 0) // state.get("chunk_size", 1)) // 50)
                finished = state.get("done", 0) + state.get("failed", 0)
                update_progress_artifact(progress, 100.0 * finished / max(state.get("total", 0), 1))
                if report.status != "paused":
                    break
            # A job.run covers a few chunks; the backfill's totals are the store's.
            seconds = (state.get("finished_at") or time.time()) - state.get("started_at", time.time())
            reports.append({**report.as_dict(), "items_written": state.get("done", 0),
                            "items_failed": state.get("failed", 0), "seconds": seconds,
                            "items_per_second": (state.get("done", 0) + state.get("failed", 0)) / seconds
                            if seconds > 0 else 0.0})
            if report.status != "complete":
                break
        status = gallery.status().as_dict()
    return {"source_space": source_space, "backfill": reports[-1], "store_status": status,
            "steps": [r["target_space"] for r in reports]}
