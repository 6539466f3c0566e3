"""Stage: build the demo gallery store and backfill it with the new model to completion.

    python -m stages.demo_store --params params.yaml \
        --old-model models/extended-data/gen0 --new-model models/extended-data/gen1-bct \
        --gallery data/splits/extended-data/gallery.parquet \
        [--old-embeddings embeddings/extended-data/gen0/gallery.npy] [--head heads/extended-data/fastfill-bct] \
        --out stores/demo

The gallery is ingested with its old-model vectors (from ``--old-embeddings`` when given, else by
embedding its images) and the ordering score that ``store.policy`` needs (old classifier confidence
or entropy; FastFill σ² from ``--head``). The backfill then re-embeds every image with the new model,
chunk by chunk, in that order. The store is built next to ``--out`` and renamed into place; a
``summary.json`` beside the database records the run. Query it with ``modelupgrade search``.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from modelupgrade.config import Params, load_params
from modelupgrade.errors import UserError, exit_on_user_error
from modelupgrade.io import atomic_path, write_json
from modelupgrade.registry.tracking import track_stage
from modelupgrade.runtime import select_device, setup_logging
from modelupgrade.store import (
    BackfillJob,
    GalleryStore,
    ManifestImageSource,
    ReEmbedImages,
    Searcher,
    build_policy,
    build_serving_mode,
    ingest_embedding_table,
)
from modelupgrade.store.models import model_embed_fn, old_classifier_scores, space_for_model

log = logging.getLogger("stages.demo_store")


def ordering_scores(params: Params, old_model: Path, old_vectors: np.ndarray, head: Path | None) -> np.ndarray | None:
    policy = params.store.policy
    if policy == "old-confidence":
        return old_classifier_scores(old_model, old_vectors, "confidence")
    if policy == "old-entropy":
        return old_classifier_scores(old_model, old_vectors, "entropy")
    if policy == "fastfill-uncertainty":
        if head is None:
            raise UserError("store.policy fastfill-uncertainty needs --head (a FastFill head predicting σ²)")
        from modelupgrade.heads import apply_with_uncertainty, load_head

        fastfill, _ = load_head(head)
        return apply_with_uncertainty(fastfill, old_vectors)[1].ravel().astype(np.float64)
    return None


def run(
    params: Params,
    old_model: Path,
    new_model: Path,
    gallery: Path,
    out: Path,
    old_embeddings: Path | None = None,
    head: Path | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    asked = {"old_model": old_model, "new_model": new_model, "gallery": gallery, "out": out,
             "old_embeddings": old_embeddings, "head": head}
    with track_stage("demo_store", params, run_name=f"demo_store@{out}", arguments=asked) as stage:
        if not gallery.is_file():
            raise UserError(f"gallery split {gallery} does not exist", hint="run the split stage first")
        stage.log_params({"seed": params.seed, "store": params.store})
        frame = pd.read_parquet(gallery)
        device = str(select_device(params.device))
        old_space = space_for_model(old_model, upgrades_from=())
        new_space = space_for_model(new_model)
        if not new_space.upgrades_from:
            # A card without a parent entry: the demo upgrades exactly this old model.
            new_space = space_for_model(new_model, upgrades_from=[old_space.name])
        images = ManifestImageSource(params.dataset)
        if old_embeddings is not None:
            if not old_embeddings.is_file():
                raise UserError(f"old gallery embeddings {old_embeddings} do not exist", hint="run the embed stage first")
            old_vectors = np.load(old_embeddings, allow_pickle=False)
        else:
            from modelupgrade.store.gallery import ItemRow

            rows = [ItemRow(i, str(r.item_id), str(r.path), int(r["index"]), None, old_space.name)
                    for i, (_, r) in enumerate(frame.iterrows())]
            loaded = images.load(rows)
            if loaded.failures:
                raise UserError(f"{len(loaded.failures)} gallery images cannot be read, e.g. {next(iter(loaded.failures.values()))}")
            old_vectors = model_embed_fn(old_model, params.store.embed_batch_size, device)(loaded.images)
        scores = ordering_scores(params, old_model, np.asarray(old_vectors, np.float32), head)

        with atomic_path(out) as tmp:
            with GalleryStore.create(tmp) as store:
                ingest_embedding_table(store, frame, old_vectors, old_space, scores)
                job = BackfillJob(
                    store, new_space, ReEmbedImages(images, model_embed_fn(new_model, params.store.embed_batch_size, device)),
                    build_policy(params.store.policy, params.seed), params.store.chunk_size, progress=progress,
                )
                report = job.run()
                if report.status != "complete":
                    raise UserError(f"the demo backfill ended with status {report.status!r}", hint="run the stage again")
                # Sanity check: an item's own new vector must find that item first.
                self_found = None
                if not report.failed:
                    probe = np.arange(min(5, store.item_count()))
                    hits = Searcher(store, build_serving_mode("mixed"), params.store.distance).search(
                        store.read_vectors(new_space.name, probe), 1)
                    self_found = float(np.mean(hits.item_ids[:, 0] == frame["item_id"].astype(str).to_numpy()[probe]))
                summary = {
                    "store": str(out),
                    "items": store.item_count(),
                    "old_space": old_space.name,
                    "new_space": new_space.name,
                    "policy": params.store.policy,
                    "chunk_size": params.store.chunk_size,
                    "backfill": report.as_dict(),
                    "status": store.status().as_dict(),
                    "self_retrieval_top1": self_found,
                    "device": device,
                }
            write_json(tmp / "summary.json", summary)
        stage.log_metrics({"items": summary["items"], "self_retrieval_top1": summary["self_retrieval_top1"],
                           "backfill_seconds": report.seconds, "backfill_items_per_second": report.items_per_second,
                           "backfill_items_failed": report.items_failed})
        stage.log_artifact(out / "summary.json", "store")
    log.info("demo store %s: %d items backfilled into %s at %.1f items/s (%d failed)", out, summary["items"],
             new_space.name, report.items_per_second, report.items_failed)
    return summary


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--old-model", type=Path, required=True)
    parser.add_argument("--new-model", type=Path, required=True)
    parser.add_argument("--gallery", type=Path, required=True)
    parser.add_argument("--old-embeddings", type=Path)
    parser.add_argument("--head", type=Path, help="FastFill head, for store.policy fastfill-uncertainty")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--progress", action="store_true")
    args = parser.parse_args(argv)
    setup_logging()
    run(load_params(args.params), args.old_model, args.new_model, args.gallery, args.out, args.old_embeddings,
        args.head, args.progress)


if __name__ == "__main__":
    main()
