"""The gallery store's commands: ingest a gallery, backfill it, search it, serve
it, show its status, cut over to the new space, roll back, clean up the old one.

Each function is one ``modelupgrade`` subcommand (``store-ingest``, ``backfill``, ``search``,
``serve``, ``store-status``, ``cutover``, ``rollback``, ``cleanup``) or the ``demo_store`` stage;
its signature and docstring are the command line (``modelupgrade.cli.arguments``). Defaults left
out come from the ``store`` section of params.yaml.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from modelupgrade.arrays import load_array
from modelupgrade.config import Params
from modelupgrade.errors import EXIT_INCOMPLETE, UserError
from modelupgrade.io import atomic_path, write_json
from modelupgrade.ordering import build_ordering
from modelupgrade.serving import build_serving_mode
from modelupgrade.store.backends import BackendSettings
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.job import BackfillPreview, BackfillReport, VectorSource
from modelupgrade.store.schema import DATABASE_FILE
from modelupgrade.store.search import QueryVectors, Searcher, SearchHits, index_recall
from modelupgrade.store.status import StoreStatus
from modelupgrade.store.steps import ServingStep

if TYPE_CHECKING:
    from modelupgrade.heads.card import HeadCard
    from modelupgrade.store.spaces import SpaceSpec

log = logging.getLogger(__name__)


def _items_table(path: Path) -> Any:
    from modelupgrade.store.ingest import read_item_table

    return read_item_table(path)


def _score_files(pairs: Sequence[str]) -> dict[str, np.ndarray]:
    scores = {}
    for pair in pairs:
        kind, sep, path = pair.partition("=")
        if not sep or not kind or not path:
            raise UserError(
                f"--score-file {pair!r} is not KIND=PATH",
                hint="e.g. --score-file fastfill-sigma2=sigma2.npy",
            )
        scores[kind] = load_array(path, f"{kind} scores", ndim=None).reshape(-1)
    return scores


def store_ingest(
    params: Params,
    items: Path,
    model: Path,
    store: Path | None = None,
    vectors: Path | None = None,
    space: str | None = None,
    score: Sequence[str] = ("old-confidence", "old-entropy"),
    score_file: Sequence[str] = (),
    fastfill_head: Path | None = None,
    device: str = "cpu",
) -> IngestReport:
    """Create (or extend) a gallery store with items and their vectors in one embedding space.

    Args:
        params: the params file: store and dataset sections
        items: manifest or split parquet naming the gallery items (item_id, path, index, label)
        model: model directory whose embedding space the vectors are in
        store: store directory (default: store.path of params.yaml)
        vectors: embedding table (.npy, row i = the items table's row i); omit to embed the images
        space: space name (default: the model directory's name)
        score: ordering scores to store with each item, computed from the stored vectors:
            old-confidence and old-entropy (the model's classifier), fastfill-sigma2 (needs
            --fastfill-head); give the option with no value to store none
        score_file: KIND=PATH: precomputed ordering scores (.npy, one per item), e.g.
            fastfill-sigma2=sigma2.npy
        fastfill_head: a FastFill head whose σ² gives the fastfill-sigma2 score
        device: torch device that runs the models and heads: cpu, cuda, cuda:1
    """
    from modelupgrade.ordering.scores import score_kind_of
    from modelupgrade.store.images import ManifestImageSource
    from modelupgrade.store.ingest import ingest_embedding_table, ingest_images, item_rows
    from modelupgrade.store.models import model_embed_fn, ordering_scores, space_for_model
    from modelupgrade.store.vectors import check_vectors

    store_path = store or Path(params.store.path)
    frame = _items_table(items)
    item_ids, sources = item_rows(frame, f"item table {items}")
    spec = space_for_model(model, name=space)
    given = _score_files(score_file)
    computed_kinds = [kind for kind in score if kind not in given]
    for kind in [*computed_kinds, *given]:
        score_kind_of(kind)
    skipped: list[dict[str, str]] = []
    if vectors is not None:
        # Checked before any score is computed from them: a wrong table is one error line.
        table = check_vectors(load_array(vectors, "embedding table"), spec, f"vectors in {vectors}")
        scores = (
            {**ordering_scores(model, table, computed_kinds, fastfill_head), **given}
            if computed_kinds
            else given
        )

        def fill(gallery: GalleryStore) -> None:
            added = ingest_embedding_table(gallery, frame, table, spec, scores)
            log.info("ingested %d items into space %r of %s", added, spec.name, store_path)
    else:
        if computed_kinds:
            raise UserError(
                f"the scores {computed_kinds} are computed from the stored vectors, "
                "which --vectors gives",
                hint="pass --vectors, or --score-file KIND=PATH for each score, or "
                "--score with no value",
            )

        def fill(gallery: GalleryStore) -> None:
            skipped[:] = ingest_images(
                gallery,
                item_ids,
                sources,
                ManifestImageSource(params.dataset),
                model_embed_fn(model, params.store.embed_batch_size, device),
                spec,
                given,
            )
            for item in skipped:
                log.warning("skipped %s: %s", item["item_id"], item["reason"])

    return IngestReport.of(_filled(store_path, fill, BackendSettings.of(params.store)), skipped)


@dataclass
class IngestReport(StoreStatus):
    """The store after an ingest, and the items the ingest skipped (images it could not read):
    an ingest that skipped items exits with ``EXIT_INCOMPLETE``."""

    skipped: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def of(cls, status: StoreStatus, skipped: list[dict[str, str]]) -> IngestReport:
        return cls(**vars(status), skipped=list(skipped))

    @property
    def exit_code(self) -> int:
        return EXIT_INCOMPLETE if self.skipped else 0

    @property
    def exit_message(self) -> str | None:
        if not self.skipped:
            return None
        first = self.skipped[0]
        return (
            f"{len(self.skipped)} item(s) were skipped and are not in the store, e.g. "
            f"{first['item_id']} ({first['reason']}); each is logged above and listed under "
            "'skipped' with --json\n  hint: fix them and ingest those items again"
        )


def _filled(
    path: Path, fill: Callable[[GalleryStore], None], backend: BackendSettings
) -> StoreStatus:
    """The store at ``path`` after ``fill``; a new store (its vectors in ``backend``) is built
    aside and appears only whole."""
    if (path / DATABASE_FILE).exists():
        with GalleryStore.open(path) as gallery:
            fill(gallery)
            return gallery.status()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        # The new store is renamed over ``path``: never over files that are not a store.
        raise UserError(
            f"{path} exists and is not a gallery store",
            hint="pass --store a new directory, or the directory of an existing store",
        )
    with atomic_path(path) as tmp, GalleryStore.create(tmp, backend) as gallery:
        fill(gallery)
    with GalleryStore.open(path) as gallery:
        return gallery.status()


def backfill(
    params: Params,
    store: Path | None = None,
    model: Path | None = None,
    transform_head: Path | None = None,
    vectors: Path | None = None,
    items: Path | None = None,
    rho_head: Path | None = None,
    space: str | None = None,
    upgrades_from: Sequence[str] = (),
    policy: str | None = None,
    chunk_size: int | None = None,
    retry_failed: bool = False,
    abort: bool = False,
    dry_run: bool = False,
    mode: str | None = None,
    forward_head: Path | None = None,
    seed: int | None = None,
    device: str = "cpu",
    progress: bool = True,
    executor: Literal["local", "ray"] = "local",
    ray_address: str | None = None,
    workers: int | None = None,
    gpus_per_worker: float | None = None,
    cpus_per_worker: float = 1.0,
) -> BackfillReport | BackfillPreview | dict[str, Any]:
    """Backfill the store into the new model's space, resumably; SIGTERM stops at a chunk boundary.

    Everything that can be checked is checked before the store changes: the model or head against
    the store's spaces (dimensions, and a sample of items computed), and whether the serving mode
    can answer queries while the backfill runs. One writer at a time: a store that another process
    writes is refused, naming it. Exit codes: 0 when every item is in the new space, 1 when items
    failed (store-status lists them; --retry-failed or --abort), 143 when stopped by SIGTERM, 2 for
    bad input.

    Args:
        params: the params file: store and dataset sections, the seed
        store: store directory (default: store.path of params.yaml)
        model: new model directory: re-embed every item's image
        transform_head: forward head: apply ψ to the stored vectors (no images needed)
        vectors: the new vectors computed elsewhere (.npy; row i = row i of --items)
        items: with --vectors: the parquet naming the item of each row (an item_id column)
        rho_head: an rm_full head: store ρ of the new vectors, the space Seo et al.'s full method
            serves (serving mode rank-merge-full)
        space: target space name (default: the model directory's name; required otherwise)
        upgrades_from: space(s) the new model upgrades (default: its card, or the serving space)
        policy: ordering policy (default: store.policy)
        chunk_size: items per atomic commit (default: store.chunk_size)
        retry_failed: re-queue the items that failed in the last backfill
        abort: abandon the running backfill instead: every item back in the space it had and the
            serving space the store had before the backfill began; the store is free for another
        dry_run: change nothing: print the items to move, the measured items/s of the vector
            source (the model or ψ, timed on a sample of them on this machine) and the estimated
            wall time, after the checks a backfill makes before it starts
        mode: serving mode the store is searched in while the backfill runs (default:
            store.serving_mode); a new space it cannot serve is refused before anything changes
        forward_head: with --mode mixed: the forward head ψ the service serves the items not yet
            backfilled with (serve --forward-head); it must map the store's vectors to the new space
        seed: seed of a random policy (default: the params seed)
        device: torch device that runs the models and heads: cpu, cuda, cuda:1
        progress: show a progress bar
        executor: where chunks are computed: here, one after another (local), or on a pool of Ray
            workers (ray; needs the [scale] extra); the plan, commits and resume are the same
        ray_address: with --executor ray: the cluster to join ('auto', ray://host:10001); default:
            start a local one
        workers: with --executor ray: actors computing chunks (default: one per
            GPU, else one per CPU)
        gpus_per_worker: with --executor ray: GPUs of each actor (default: 1 when
            the cluster has GPUs)
        cpus_per_worker: with --executor ray: CPUs of each actor
    """
    from modelupgrade.store.images import ManifestImageSource
    from modelupgrade.store.job import (
        ReEmbedImages,
        ServingCheck,
        TableVectors,
        TransformStored,
        abort_backfill,
        preview_backfill,
    )
    from modelupgrade.store.models import (
        head_transform_fn,
        model_embed_fn,
        space_for_model,
        store_head_fn,
    )
    from modelupgrade.store.spaces import SpaceSpec

    store_path = store or Path(params.store.path)
    if dry_run and (abort or retry_failed):
        raise UserError(
            "--dry-run previews a backfill; it takes no "
            + ("--abort" if abort else "--retry-failed"),
            hint="preview first, then run the command without --dry-run",
        )
    if abort:
        extra = [
            name
            for name, value in (
                ("--model", model),
                ("--transform-head", transform_head),
                ("--vectors", vectors),
                ("--items", items),
                ("--rho-head", rho_head),
                ("--retry-failed", retry_failed or None),
            )
            if value is not None
        ]
        if extra:
            raise UserError(
                f"--abort undoes the running backfill; it takes no {', '.join(extra)}",
                hint=f"run `modelupgrade backfill --store {store_path} --abort` alone",
            )
        with GalleryStore.open(store_path) as gallery:
            return abort_backfill(gallery)
    given = [
        name
        for name, value in (
            ("--model", model),
            ("--transform-head", transform_head),
            ("--vectors", vectors),
        )
        if value is not None
    ]
    if len(given) != 1:
        raise UserError(
            f"give exactly one source of new vectors, got {', '.join(given) or 'none'}",
            hint="--model (re-embed images), --transform-head (ψ on stored vectors) "
            "or --vectors (a table)",
        )
    if (vectors is None) != (items is None):
        raise UserError(
            "--vectors and --items go together", hint="the items table names the item of each row"
        )
    serving_check = ServingCheck(
        build_serving_mode(mode or params.store.serving_mode), forward_head is not None
    )
    rho = head_transform_fn(rho_head, device, "new_embedding")[0] if rho_head else None
    form: Literal["rho", "new"] = "rho" if rho is not None else "new"
    # A dry run is a reader: it takes no writer lock, so it leaves the store's files as they are.
    with (
        GalleryStore.open(store_path) as gallery,
        contextlib.nullcontext() if dry_run else gallery.writing("backfill"),
    ):
        if retry_failed:
            gallery.backfills.retry_failed()
        serving = gallery.serving_space()
        active = gallery.backfills.active()
        # The space of the items a backfill moves: a running one's source, else the serving space.
        moving = gallery.space(active.source_space if active else str(serving))
        if model is not None:
            spec = space_for_model(model, name=space, upgrades_from=list(upgrades_from) or None)
            if not spec.upgrades_from and serving:
                spec = space_for_model(model, name=space, upgrades_from=[serving])
            embed = model_embed_fn(model, params.store.embed_batch_size, device)
            source: VectorSource = ReEmbedImages(
                ManifestImageSource(params.dataset),
                embed if rho is None else (lambda images: rho(embed(images))),
            )
        else:
            if not space:
                raise UserError(
                    "--space is required without --model",
                    hint="name the new model version, e.g. gen1-bict",
                )
            parents = tuple(upgrades_from) or ((serving,) if serving else ())
            if transform_head is not None:
                transform, card = store_head_fn(gallery, transform_head, space, device)
                _check_head(transform_head, "--transform-head", card, moving)
                dim, source, ref = card.out_dim, TransformStored(transform), str(transform_head)
            else:
                # --vectors and --items come together (checked above), here both given.
                frame = _items_table(items)  # type: ignore[arg-type]
                table = load_array(vectors, "new vector table")  # type: ignore[arg-type]
                if "item_id" not in frame.columns:
                    raise UserError(f"{items} has no item_id column")
                source = TableVectors(
                    frame["item_id"].astype(str).tolist(), table if rho is None else rho(table)
                )
                dim, ref = table.shape[1], str(vectors)
            spec = SpaceSpec(space, dim, parents, backward_compatible=True, model_ref=ref)
        if rho is not None:
            spec = SpaceSpec(
                spec.name,
                spec.dim,
                spec.upgrades_from,
                spec.backward_compatible,
                spec.model_ref,
                form,
            )
        if forward_head is not None:
            from modelupgrade.heads import read_head_card

            _check_head(forward_head, "--forward-head", read_head_card(forward_head), moving, spec)
        if dry_run:
            return preview_backfill(gallery, spec, source, serving_check)
        if executor == "ray":
            return _backfill_on_ray(
                gallery,
                spec,
                params,
                model,
                transform_head,
                rho_head,
                policy,
                chunk_size,
                seed,
                progress,
                ray_address,
                workers,
                gpus_per_worker,
                cpus_per_worker,
                serving_check,
            )
        return _backfill_job(
            gallery, spec, source, params, policy, chunk_size, seed, progress, serving_check
        ).run()


def _check_head(
    path: Path, option: str, card: HeadCard, takes: SpaceSpec, gives: SpaceSpec | None = None
) -> None:
    """Refuse a forward head (``card``) that does not take the vectors of space ``takes`` or,
    with ``gives``, does not give that space's: before the backfill changes anything."""
    problems = []
    if card.direction != "forward":
        problems.append(f"it is a {card.direction} head ({card.kind}), not a forward one")
    if card.in_dim != takes.dim:
        problems.append(
            f"it takes {card.in_dim}-d vectors, but the store's vectors to backfill (space "
            f"{takes.name!r}) are {takes.dim}-d"
        )
    if gives is not None and card.out_dim != gives.dim:
        problems.append(
            f"it gives {card.out_dim}-d vectors, space {gives.name!r} holds {gives.dim}-d"
        )
    if problems:
        raise UserError(
            f"{option} {path}: {'; '.join(problems)}; nothing was changed",
            hint=f"pass the head trained from the model of space {takes.name!r}"
            + (f" to that of {gives.name!r}" if gives is not None else ""),
        )


def _backfill_job(
    gallery: GalleryStore,
    spec: Any,
    vectors: Any,
    params: Params,
    policy: str | None,
    chunk_size: int | None,
    seed: int | None,
    progress: bool,
    serving: Any,
) -> Any:
    """The backfill job of either executor, with the command line's settings over params.yaml's."""
    from modelupgrade.store.job import BackfillJob

    return BackfillJob(
        gallery,
        spec,
        vectors,
        build_ordering(policy or params.store.policy),
        chunk_size or params.store.chunk_size,
        seed=params.seed if seed is None else seed,
        progress=progress,
        serving=serving,
    )


def _backfill_on_ray(
    gallery: GalleryStore,
    spec: Any,
    params: Params,
    model: Path | None,
    transform_head: Path | None,
    rho_head: Path | None,
    policy: str | None,
    chunk_size: int | None,
    seed: int | None,
    progress: bool,
    address: str | None,
    workers: int | None,
    gpus_per_worker: float | None,
    cpus_per_worker: float,
    serving: Any,
) -> BackfillReport:
    try:
        import ray
    except ImportError:
        raise UserError(
            "the Ray executor needs the optional dependencies", hint="pip install '.[scale]'"
        ) from None
    from modelupgrade.scale.ray_backfill import (
        HeadVectors,
        ModelVectors,
        RayExecutor,
        VectorRecipe,
        WorkerPool,
    )
    from modelupgrade.store.images import ManifestImageSource

    if rho_head is not None or (model is None and transform_head is None):
        raise UserError(
            "the Ray executor re-embeds images (--model) or applies ψ (--transform-head)",
            hint="run a --vectors or --rho-head backfill with --executor local",
        )
    recipe: VectorRecipe = (
        ModelVectors(str(model), ManifestImageSource(params.dataset), params.store.embed_batch_size)
        if model is not None
        else HeadVectors(str(transform_head))
    )
    executor = RayExecutor(recipe)
    ray.init(**({"address": address} if address else {"include_dashboard": False}))
    try:
        executor.pool = WorkerPool.for_cluster(workers, gpus_per_worker, cpus_per_worker)
        return _backfill_job(
            gallery, spec, executor, params, policy, chunk_size, seed, progress, serving
        ).run()
    finally:
        ray.shutdown()


@dataclass
class SearchResult:
    """Hits of each query, labelled as the command line named the queries."""

    queries: list[str]
    hits: SearchHits

    def as_dict(self) -> list[dict[str, Any]]:
        return [
            {"query": q, "hits": r} for q, r in zip(self.queries, self.hits.records(), strict=True)
        ]

    def describe(self) -> str:
        lines = []
        for query, row in zip(self.queries, self.hits.records(), strict=True):
            lines.append(f"query {query}:")
            lines += [
                f"  {rank:3d}. {hit['item_id']:<24} distance={hit['distance']:<11.4g}  "
                f"space={hit['space']}"
                for rank, hit in enumerate(row, 1)
            ]
        return "\n".join(lines)


def _row_range(rows: str | None, count: int) -> slice:
    """The rows ``--rows`` names: ``I`` is row I alone, ``START:STOP`` rows START … STOP − 1 (both
    ends given, counted from 0, as in Python)."""
    if rows is None:
        return slice(None)
    start, sep, stop = rows.partition(":")
    try:
        first = int(start)
        last = int(stop) if sep else first + 1
    except ValueError:
        raise UserError(
            f"--rows {rows!r} is not a row number I or a range START:STOP",
            hint="e.g. --rows 3 (row 3 alone) or --rows 0:5 (rows 0 to 4)",
        ) from None
    if not 0 <= first < last <= count:
        raise UserError(
            f"--rows {rows!r} selects no rows of the {count} query vectors",
            hint=f"rows are numbered 0 to {count - 1}; START:STOP stops before STOP",
        )
    return slice(first, last)


def search(
    params: Params,
    store: Path | None = None,
    queries: Path | None = None,
    old_queries: Path | None = None,
    rows: str | None = None,
    item_id: Sequence[str] = (),
    k: int | None = None,
    mode: str | None = None,
    forward_head: Path | None = None,
    reverse_head: Path | None = None,
    distance: Literal["cosine", "l2"] | None = None,
    device: str = "cpu",
) -> SearchResult:
    """Top-k items for each query, naming the embedding space each hit came from.

    Args:
        params: the params file: its store section gives the defaults
        store: store directory (default: store.path of params.yaml)
        queries: query vectors (.npy) embedded by the serving space's model
        old_queries: the same queries embedded by the old model (serving mode rank-merge)
        rows: rows of --queries to use, counted from 0: I (row I alone) or START:STOP (rows
            START to STOP-1); default: every row
        item_id: query by example: stored items already in the serving space
        k: hits per query, at least 1 (default: store.top_k)
        mode: serving mode (default: store.serving_mode): mixed, rank-merge, rank-merge-rqt,
            rank-merge-full
        forward_head: forward head ψ for mixed (ψ(old) for items not yet backfilled)
        reverse_head: reverse head for rank-merge-rqt (rqt, mcl) or rank-merge-full (rm_full)
        distance: cosine or l2 (default: store.distance)
        device: torch device that runs the heads: cpu, cuda, cuda:1
    """
    from modelupgrade.store.models import load_head_transforms

    if k is not None and k < 1:
        raise UserError(f"--k must be at least 1, got {k}", hint="--k is the hits per query")
    config = params.store
    heads = load_head_transforms(forward_head, reverse_head, device)
    with GalleryStore.open(store or Path(config.path)) as gallery:
        searcher = Searcher(
            gallery,
            build_serving_mode(mode or config.serving_mode),
            distance or config.distance,
            heads,
        )
        if queries is not None:
            vectors = load_array(queries, "query vectors")
            chosen = _row_range(rows, len(vectors))
            old = (
                None
                if old_queries is None
                else load_array(old_queries, "old-model query vectors")[chosen]
            )
            labels = [f"row {i}" for i in range(len(vectors))[chosen]]
            query = QueryVectors(vectors[chosen], old)
        elif item_id:
            snapshot = searcher.snapshot()
            position = {str(i): p for p, i in enumerate(snapshot.item_ids)}
            unknown = [i for i in item_id if i not in position]
            if unknown:
                raise UserError(f"unknown item id(s): {', '.join(unknown)}")
            stale = [i for i in item_id if snapshot.spaces[position[i]] != snapshot.serving_space]
            if stale:
                raise UserError(
                    f"item(s) {', '.join(stale)} are not backfilled into "
                    f"{snapshot.serving_space!r} yet",
                    hint="query by example needs a vector in the serving space; "
                    "pass --queries instead",
                )
            slots = np.array([snapshot.slots[position[i]] for i in item_id])
            query = QueryVectors(gallery.read_vectors(str(snapshot.serving_space), slots))
            labels = list(item_id)
        else:
            raise UserError("give --queries (a .npy of query vectors) or --item-id")
        hits = searcher.search(query, config.top_k if k is None else k)
    return SearchResult(labels, hits)


def serve(
    params: Params,
    store: Path | None = None,
    host: str | None = None,
    port: int | None = None,
    mode: str | None = None,
    forward_head: Path | None = None,
    reverse_head: Path | None = None,
    device: str = "cpu",
) -> None:
    """HTTP service: POST /search, GET /health, GET /backfill/status.

    With the environment variable MODELUPGRADE_SERVICE_TOKEN set, /search and /backfill/status
    require the header 'Authorization: Bearer <token>'; bound to an address other machines can
    reach without it, the service warns. A request may carry at most store.max_query_vectors
    queries and ask for at most store.max_k hits each.

    Args:
        params: the params file: its store section gives the defaults
        store: store directory (default: store.path of params.yaml)
        host: bind address (default: store.host, 127.0.0.1)
        port: port (default: store.port)
        mode: serving mode (default: store.serving_mode)
        forward_head: forward head ψ for mixed
        reverse_head: reverse head for rank-merge-rqt or rank-merge-full
        device: torch device that runs the heads
    """
    import os

    import uvicorn

    from modelupgrade.store.models import load_head_transforms
    from modelupgrade.store.service import TOKEN_ENV, create_app, exposure_warning

    config = params.store
    token = os.environ.get(TOKEN_ENV) or None
    bind = host or config.host
    app = create_app(
        store or Path(config.path),
        build_serving_mode(mode or config.serving_mode),
        config.distance,
        config.top_k,
        load_head_transforms(forward_head, reverse_head, device),
        token=token,
        max_query_vectors=config.max_query_vectors,
        max_k=config.max_k,
    )
    warning = exposure_warning(bind, token)
    if warning:
        log.warning(warning)
    uvicorn.run(app, host=bind, port=port or config.port)


def store_status(params: Params, store: Path | None = None) -> StoreStatus:
    """What a store holds: items per space and state, its spaces and scores, its last backfill,
    and its index with its recall@10 against an exact scan in each space.

    Args:
        params: the params file: its store section gives the default store
        store: store directory (default: store.path of params.yaml)
    """
    with GalleryStore.open(store or Path(params.store.path)) as gallery:
        status = gallery.status()
        if status.items:
            status.index = index_recall(gallery)
        return status


def cutover(
    params: Params,
    reason: str,
    query_split: Path,
    store: Path | None = None,
    new_query_vectors: Path | None = None,
    old_query_vectors: Path | None = None,
    new_model: Path | None = None,
    old_model: Path | None = None,
    device: str = "cpu",
) -> ServingStep:
    """Make the completed backfill's new space final, once its shadow evaluation passes.

    The store answers a labelled query sample from the new space and from the old one (both
    spaces' vectors are still in the store), scored by the project's evaluator; the registry's gate
    decides: the gate metric (registry.gate_metric, else evaluation.headline_metric) at least as
    high in the new space, and negative flips within registry.gates.max_negative_flip_rate. The
    sample's items are held out of the gallery it is scored against (a query that is a stored item
    never finds itself). For a sample of stored items, a side given neither vectors nor a model is
    read from the store: the old model's stored vectors (so a dead old model can be judged), the
    new space's when the backfill re-embedded the items. On Milvus the store's serving alias then
    points at the new space's collection. The old vectors are kept for
    store.rollback_window_hours (`modelupgrade rollback`, `modelupgrade cleanup`).

    Args:
        params: the params file: store, evaluation and registry sections, the dataset
        reason: why, recorded with who and when (store-status shows it)
        query_split: labelled query sample: a table of item_id, label and path (each an image
            file, absolute or relative to the table's folder), or a split file
        store: store directory (default: store.path of params.yaml)
        new_query_vectors: the sample's query vectors in the new space: a parquet of item_id and
            embedding, or a .npy (row i = row i of --query-split); or --new-model
        old_query_vectors: the sample's query vectors in the old space, as --new-query-vectors;
            or --old-model
        new_model: model directory that embeds the sample's images into the new space
        old_model: model directory that embeds the sample's images into the old space
        device: torch device that runs the models: cpu, cuda, cuda:1
    """
    from modelupgrade.data.image_table import read_labelled_images
    from modelupgrade.store.cutover import cutover as cut_over
    from modelupgrade.store.shadow import QuerySample, shadow_evaluate

    images = new_model is not None or old_model is not None
    frame = read_labelled_images(query_split, "the query sample", images)
    new = _query_vectors(params, frame, new_query_vectors, new_model, "new", device)
    old = _query_vectors(params, frame, old_query_vectors, old_model, "old", device)
    ids = tuple(frame["item_id"].astype(str))
    sample = QuerySample(frame["label"].to_numpy(np.int64), new, old, str(query_split), ids)
    with GalleryStore.open(store or Path(params.store.path)) as gallery:
        return cut_over(
            gallery,
            reason,
            params.store.rollback_window_hours,
            lambda backfill: shadow_evaluate(gallery, backfill, sample, params),
        )


def _query_vectors(
    params: Params,
    frame: Any,
    vectors: Path | None,
    model: Path | None,
    side: str,
    device: str,
) -> np.ndarray | None:
    """The query sample in the ``side`` space: read from ``vectors``, embedded by ``model``, or
    None (read from the store for the sample's stored items)."""
    from modelupgrade.data import load_images
    from modelupgrade.data.vector_table import vectors_for_items
    from modelupgrade.store.models import model_embed_fn

    if vectors is not None and model is not None:
        raise UserError(
            f"give the query sample's {side}-space vectors one way: --{side}-query-vectors "
            f"or --{side}-model",
            hint=f"--{side}-query-vectors (a parquet of item_id and embedding, or a .npy), "
            f"--{side}-model DIR to embed its images, or neither for stored items",
        )
    if vectors is not None:
        ids = frame["item_id"].astype(str).tolist()
        return vectors_for_items(vectors, ids, f"{side}-space query vectors")
    if model is None:
        return None
    images = load_images(frame, params.dataset)
    return model_embed_fn(model, params.store.embed_batch_size, device)(images.numpy())


def rollback(params: Params, reason: str, store: Path | None = None) -> ServingStep:
    """Serve the old space again after a backfill (cut over or not), while its vectors are kept.

    Every item the backfill moved points at its old vector again (checked against its recorded
    checksum first), the old space becomes the serving space and, on Milvus, the serving alias
    points at its collection. Refused once `modelupgrade cleanup` dropped the old vectors.
    `modelupgrade cutover` moves to the new space again (its vectors stay).

    Args:
        params: the params file: its store section gives the default store
        reason: why, recorded with who and when (store-status shows it)
        store: store directory (default: store.path of params.yaml)
    """
    from modelupgrade.store.cutover import rollback as roll_back

    with GalleryStore.open(store or Path(params.store.path)) as gallery:
        return roll_back(gallery, reason)


def cleanup(
    params: Params, reason: str, store: Path | None = None, force: bool = False
) -> ServingStep:
    """Drop the old space's vectors of a cut-over backfill once its rollback window has passed.

    The window is store.rollback_window_hours from the cutover. After a cleanup no rollback is
    possible. The step is recorded before the vectors go, so a run interrupted after it finishes
    the drop when run again.

    Args:
        params: the params file: its store section gives the default store
        reason: why, recorded with who and when (store-status shows it)
        store: store directory (default: store.path of params.yaml)
        force: drop them before the window ends (the --reason says why)
    """
    from modelupgrade.store.cutover import cleanup as clean_up

    with GalleryStore.open(store or Path(params.store.path)) as gallery:
        return clean_up(gallery, reason, force)


def demo_store(
    params: Params,
    old_model: Path,
    new_model: Path,
    gallery: Path,
    out: Path,
    old_embeddings: Path | None = None,
    head: Path | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Build the demo gallery store and backfill it with the new model to completion.

    The gallery is ingested with its old-model vectors and every ordering score the old model's
    classifier gives (and FastFill's σ² with --head), then re-embedded with the new model chunk by
    chunk in the order of store.policy. The store is built aside and renamed into place; its
    summary.json records the run.

    Args:
        params: the params file: store and dataset sections, seed, device
        old_model: the model whose vectors the gallery holds first
        new_model: the model the backfill re-embeds the gallery with
        gallery: the gallery split (parquet) to ingest
        out: the store directory to create
        old_embeddings: the old model's gallery embeddings (.npy); omit to embed the images
        head: a FastFill head: also store the fastfill-sigma2 score
        progress: show a progress bar
    """
    from modelupgrade.registry.stage_tracking import track_stage
    from modelupgrade.runtime import select_device
    from modelupgrade.store.images import ManifestImageSource
    from modelupgrade.store.ingest import ingest_embedding_table
    from modelupgrade.store.job import BackfillJob, ReEmbedImages
    from modelupgrade.store.models import (
        CLASSIFIER_SCORES,
        model_embed_fn,
        ordering_scores,
        space_for_model,
    )
    from modelupgrade.store.schema import ItemRow

    asked = {
        "old_model": old_model,
        "new_model": new_model,
        "gallery": gallery,
        "out": out,
        "old_embeddings": old_embeddings,
        "head": head,
    }
    with track_stage("demo_store", params, run_name=f"demo_store@{out}", arguments=asked) as stage:
        stage.log_params({"seed": params.seed, "store": params.store})
        frame = _items_table(gallery)
        device = str(select_device(params.device))
        old_space = space_for_model(old_model, upgrades_from=())
        new_space = space_for_model(new_model, upgrades_from=[old_space.name])
        images = ManifestImageSource(params.dataset)
        if old_embeddings is not None:
            old_vectors = load_array(old_embeddings, "old gallery embeddings", mmap=False)
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
            old_vectors = model_embed_fn(old_model, params.store.embed_batch_size, device)(
                loaded.images
            )
        kinds = [*CLASSIFIER_SCORES, *(["fastfill-sigma2"] if head is not None else [])]
        scores = ordering_scores(old_model, old_vectors, kinds, head)
        with atomic_path(out) as tmp:
            with GalleryStore.create(tmp, BackendSettings.of(params.store)) as store:
                ingest_embedding_table(store, frame, old_vectors, old_space, scores)
                job = BackfillJob(
                    store,
                    new_space,
                    ReEmbedImages(
                        images, model_embed_fn(new_model, params.store.embed_batch_size, device)
                    ),
                    build_ordering(params.store.policy),
                    params.store.chunk_size,
                    seed=params.seed,
                    progress=progress,
                )
                report = job.run()
                if report.status != "complete":
                    raise UserError(
                        f"the demo backfill ended with status {report.status!r}",
                        hint="run the stage again",
                    )
                # Sanity check: an item's own new vector must find that item first.
                self_found = None
                if not report.failed:
                    probe = np.arange(min(5, store.item_count()))
                    hits = Searcher(
                        store, build_serving_mode("mixed"), params.store.distance
                    ).search(store.read_vectors(new_space.name, probe), 1)
                    self_found = float(
                        np.mean(
                            hits.item_ids[:, 0] == frame["item_id"].astype(str).to_numpy()[probe]
                        )
                    )
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
        stage.log_metrics(
            {
                "items": summary["items"],
                "self_retrieval_top1": summary["self_retrieval_top1"],
                "backfill_seconds": report.seconds,
                "backfill_items_per_second": report.items_per_second,
                "backfill_items_failed": report.items_failed,
            }
        )
        stage.log_artifact(out / "summary.json", "store")
    log.info(
        "demo store %s: %d items backfilled into %s at %.1f items/s (%d failed)",
        out,
        summary["items"],
        new_space.name,
        report.items_per_second,
        report.items_failed,
    )
    return summary
