"""Commands of the gallery store: ``store-ingest``, ``backfill``, ``search``, ``serve``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import typer

from modelupgrade.config.store import StoreParams
from modelupgrade.errors import UserError

log = logging.getLogger(__name__)

PARAMS_HELP = "params file: its store section gives the defaults (built-in defaults when it is missing)"
DEVICE_HELP = "torch device that runs the models and heads: cpu, cuda, cuda:1"
FORWARD_HEAD_HELP = "forward head for 'mixed' (ψ(old) for not yet backfilled items)"
REVERSE_HEAD_HELP = "reverse head for 'rank-merge' (ψ_rev(query))"


def _params(params_path: Path) -> tuple[StoreParams, object | None]:
    """The ``store`` section (and the whole params, for the dataset) or the defaults without a file."""
    if not params_path.is_file():
        return StoreParams(), None
    from modelupgrade.plugins import load_params

    params = load_params(params_path)
    return params.store, params


def _serving_mode(name: str, forward_head: Path | None, reverse_head: Path | None, device: str):  # type: ignore[no-untyped-def]
    from modelupgrade.store import build_serving_mode
    from modelupgrade.store.models import head_transform_fn

    forward = head_transform_fn(forward_head, device)[0] if forward_head else None
    reverse = head_transform_fn(reverse_head, device)[0] if reverse_head else None
    return build_serving_mode(name, forward=forward, reverse=reverse)


def _load_npy(path: Path, what: str) -> np.ndarray:
    if not path.is_file():
        raise UserError(f"{what} file {path} does not exist")
    return np.load(path, allow_pickle=False)


def store_ingest(
    store: Path = typer.Option(None, help="store directory (default: store.path of params.yaml)"),
    items: Path = typer.Option(..., help="manifest or split parquet naming the gallery items"),
    model: Path = typer.Option(..., help="model directory whose embedding space the vectors are in"),
    vectors: Path | None = typer.Option(None, help="embedding table (.npy, rows = items' rows); omit to embed the images"),
    space: str | None = typer.Option(None, help="space name (default: the model directory's name)"),
    score: str = typer.Option("confidence", help="ordering score from the model's classifier: confidence, entropy, none"),
    scores_file: Path | None = typer.Option(None, help="ordering scores (.npy, one per item), e.g. FastFill σ²"),
    params: Path = typer.Option(Path("params.yaml"), help=PARAMS_HELP),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
) -> None:
    """Create (or extend) a gallery store with items and their vectors in one embedding space."""
    import pandas as pd

    from modelupgrade.store import GalleryStore, ManifestImageSource, ingest_embedding_table, ingest_images
    from modelupgrade.store.gallery import DATABASE_FILE, ItemSources
    from modelupgrade.store.models import model_embed_fn, old_classifier_scores, space_for_model

    store_params, all_params = _params(params)
    store_path = store or Path(store_params.path)
    if not items.is_file():
        raise UserError(f"item table {items} does not exist")
    frame = pd.read_parquet(items)
    spec = space_for_model(model, name=space)
    if vectors is not None:
        table = _load_npy(vectors, "embedding")
    else:
        if all_params is None:
            raise UserError("embedding images needs the dataset section of params.yaml", hint=f"{params} is missing")
        table = None
    scores = _load_npy(scores_file, "scores") if scores_file else None
    opened = GalleryStore.open(store_path) if (store_path / DATABASE_FILE).exists() else GalleryStore.create(store_path)
    with opened as gallery:
        if table is not None:
            if scores is None and score != "none":
                scores = old_classifier_scores(model, table, score)
            added = ingest_embedding_table(gallery, frame, table, spec, scores)
            skipped: list[dict[str, str]] = []
        else:
            sources = ItemSources(frame["path"].astype(str).tolist(), frame["index"].astype(int).tolist(),
                                  frame["label"].astype(int).tolist() if "label" in frame.columns else None)
            skipped = ingest_images(
                gallery, frame["item_id"].astype(str).tolist(), sources,
                ManifestImageSource(all_params.dataset),  # type: ignore[attr-defined]
                model_embed_fn(model, store_params.embed_batch_size, device), spec, scores,
            )
            added = len(frame) - len(skipped)
            if score != "none" and scores is None:
                log.warning("no ordering scores stored for images ingested without --vectors; use --scores-file")
        typer.echo(f"ingested {added} items into space {spec.name!r} of {store_path}")
        for item in skipped:
            typer.echo(f"skipped {item['item_id']}: {item['reason']}", err=True)


def backfill(
    store: Path = typer.Option(None, help="store directory (default: store.path of params.yaml)"),
    model: Path | None = typer.Option(None, help="new model directory: re-embed every item's image"),
    transform_head: Path | None = typer.Option(None, help="forward head: apply ψ to stored vectors (no images)"),
    space: str | None = typer.Option(None, help="target space name (default: the model directory's name)"),
    upgrades_from: list[str] = typer.Option(None, help="generation(s) the new model upgrades (default: its card)"),
    policy: str | None = typer.Option(None, help="ordering policy (default: store.policy)"),
    chunk_size: int | None = typer.Option(None, help="items per atomic commit (default: store.chunk_size)"),
    retry_failed: bool = typer.Option(False, help="re-queue the items that failed in the last backfill"),
    seed: int | None = typer.Option(None, help="seed of the random policy (default: params seed)"),
    params: Path = typer.Option(Path("params.yaml"), help=PARAMS_HELP),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
    progress: bool = typer.Option(True, help="show a progress bar"),
) -> None:
    """Backfill the store into the new model's space, resumably; SIGTERM stops at a chunk boundary."""
    from modelupgrade.store import BackfillJob, GalleryStore, ManifestImageSource, ReEmbedImages, SpaceSpec, TransformStored, build_policy
    from modelupgrade.store.models import head_transform_fn, model_embed_fn, space_for_model

    store_params, all_params = _params(params)
    if (model is None) == (transform_head is None):
        raise UserError("give exactly one of --model (re-embed images) and --transform-head (apply ψ)")
    with GalleryStore.open(store or Path(store_params.path)) as gallery:
        if retry_failed:
            gallery.retry_failed()
        if model is not None:
            spec = space_for_model(model, name=space, upgrades_from=upgrades_from or None)
            if all_params is None:
                raise UserError("re-embedding images needs the dataset section of params.yaml", hint=f"{params} is missing")
            source = ReEmbedImages(ManifestImageSource(all_params.dataset),  # type: ignore[attr-defined]
                                   model_embed_fn(model, store_params.embed_batch_size, device))
        else:
            transform, card = head_transform_fn(transform_head, device)  # type: ignore[arg-type]
            if not space:
                raise UserError("--space is required with --transform-head", hint="name the new model version, e.g. gen1-bict")
            current = gallery.snapshot().serving_space
            spec = SpaceSpec(space, int(card["out_dim"]), tuple(upgrades_from or ([current] if current else [])),
                             backward_compatible=True, model_ref=str(transform_head))
            source = TransformStored(transform)
        job = BackfillJob(
            gallery, spec, source,
            build_policy(policy or store_params.policy, seed if seed is not None else getattr(all_params, "seed", 0)),
            chunk_size or store_params.chunk_size, progress=progress,
        )
        report = job.run()
    typer.echo(json.dumps(report.as_dict(), indent=2))
    if report.status == "stopped":
        raise typer.Exit(code=0)


def search(
    store: Path = typer.Option(None, help="store directory (default: store.path of params.yaml)"),
    queries: Path | None = typer.Option(None, help="query vectors (.npy) in the serving space"),
    rows: str | None = typer.Option(None, help="rows of --queries to use, e.g. 0:5"),
    item_id: list[str] = typer.Option(None, help="query by example: stored items already in the serving space"),
    k: int | None = typer.Option(None, help="hits per query (default: store.top_k)"),
    mode: str | None = typer.Option(None, help="serving mode (default: store.serving_mode)"),
    forward_head: Path | None = typer.Option(None, help=FORWARD_HEAD_HELP),
    reverse_head: Path | None = typer.Option(None, help=REVERSE_HEAD_HELP),
    distance: str | None = typer.Option(None, help="cosine or l2 (default: store.distance)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    params: Path = typer.Option(Path("params.yaml"), help=PARAMS_HELP),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
) -> None:
    """Top-k items for each query, naming the embedding space each hit came from."""
    from modelupgrade.store import GalleryStore, Searcher

    store_params, _ = _params(params)
    with GalleryStore.open(store or Path(store_params.path)) as gallery:
        searcher = Searcher(gallery, _serving_mode(mode or store_params.serving_mode, forward_head, reverse_head, device),
                            distance or store_params.distance)  # type: ignore[arg-type]
        if queries is not None:
            vectors = _load_npy(queries, "query")
            if rows:
                start, _, stop = rows.partition(":")
                vectors = vectors[int(start or 0) : int(stop) if stop else None]
            labels = [f"row {i}" for i in range(len(vectors))]
        elif item_id:
            snapshot = searcher.snapshot()
            position = {str(i): p for p, i in enumerate(snapshot.item_ids)}
            unknown = [i for i in item_id if i not in position]
            if unknown:
                raise UserError(f"unknown item id(s): {', '.join(unknown)}")
            stale = [i for i in item_id if snapshot.spaces[position[i]] != snapshot.serving_space]
            if stale:
                raise UserError(f"item(s) {', '.join(stale)} are not backfilled into {snapshot.serving_space!r} yet",
                                hint="query by example needs a vector in the serving space; pass --queries instead")
            vectors = gallery.read_vectors(str(snapshot.serving_space),
                                           np.array([snapshot.slots[position[i]] for i in item_id]))
            labels = list(item_id)
        else:
            raise UserError("give --queries (a .npy of query vectors) or --item-id")
        hits = searcher.search(vectors, k or store_params.top_k)
    records = hits.records()
    if as_json:
        typer.echo(json.dumps([{"query": q, "hits": r} for q, r in zip(labels, records, strict=True)], indent=2))
        return
    for query, row in zip(labels, records, strict=True):
        typer.echo(f"query {query}:")
        for rank, hit in enumerate(row, 1):
            typer.echo(f"  {rank:3d}. {hit['item_id']:<24} distance={hit['distance']:<11.4g}  space={hit['space']}")


def serve(
    store: Path = typer.Option(None, help="store directory (default: store.path of params.yaml)"),
    host: str | None = typer.Option(None, help="bind address (default: store.host, 127.0.0.1)"),
    port: int | None = typer.Option(None, help="port (default: store.port)"),
    mode: str | None = typer.Option(None, help="serving mode (default: store.serving_mode)"),
    forward_head: Path | None = typer.Option(None, help=FORWARD_HEAD_HELP),
    reverse_head: Path | None = typer.Option(None, help=REVERSE_HEAD_HELP),
    params: Path = typer.Option(Path("params.yaml"), help=PARAMS_HELP),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
) -> None:
    """HTTP service: POST /search, GET /health, GET /backfill/status."""
    import uvicorn

    from modelupgrade.store.service import create_app

    store_params, _ = _params(params)
    app = create_app(store or Path(store_params.path),
                     _serving_mode(mode or store_params.serving_mode, forward_head, reverse_head, device),
                     store_params.distance, store_params.top_k)
    uvicorn.run(app, host=host or store_params.host, port=port or store_params.port)


def register(app: typer.Typer) -> None:
    app.command("store-ingest")(store_ingest)
    app.command("backfill")(backfill)
    app.command("search")(search)
    app.command("serve")(serve)
