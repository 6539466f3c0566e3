"""The backfill operations: run (or resume) a backfill, preview it, abort it.

``run_backfill`` is what ``modelupgrade backfill``, the Prefect follow path and the Ray executor all
run: the request's vector source is built and checked against the store (``new_vector_source``), and
the job is assembled from the request and params.yaml in one place (``backfill_job``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from modelupgrade.arrays import load_array
from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.ordering import build_ordering
from modelupgrade.serving import build_serving_mode
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.job import BackfillJob, ChunkExecutor, abort_backfill
from modelupgrade.store.ledger import AbortRecord
from modelupgrade.store.operations.requests import BackfillRequest, Chunking
from modelupgrade.store.preview import BackfillPreview, preview_backfill
from modelupgrade.store.report import BackfillReport
from modelupgrade.store.serving_check import ServingCheck
from modelupgrade.store.sources import TransformFn, VectorSource
from modelupgrade.store.spaces import SpaceSpec

if TYPE_CHECKING:
    from modelupgrade.heads.card import HeadCard


def backfill_job(
    gallery: GalleryStore,
    target: SpaceSpec,
    source: VectorSource | ChunkExecutor,
    chunking: Chunking,
    progress: bool = True,
    serving: ServingCheck | None = None,
) -> BackfillJob:
    """The backfill job of ``gallery`` into ``target`` with ``source``'s vectors, chunked as
    ``chunking`` says: the one place a request becomes a job."""
    return BackfillJob(
        gallery,
        target,
        source,
        build_ordering(chunking.policy),
        chunking.chunk_size,
        seed=chunking.seed,
        progress=progress,
        serving=serving,
    )


def run_backfill(params: Params, request: BackfillRequest) -> BackfillReport:
    """Run (or resume) the backfill ``request`` asks for (see ``modelupgrade backfill``)."""
    with GalleryStore.open(request.store) as gallery, gallery.writing("backfill"):
        if request.retry_failed:
            gallery.backfills.retry_failed()
        spec, source = new_vector_source(params, request, gallery)
        serving = _serving_check(request)
        if request.ray is not None:
            return _on_ray(params, request, gallery, spec, serving)
        return backfill_job(
            gallery, spec, source, request.chunking, request.progress, serving
        ).run()


def preview(params: Params, request: BackfillRequest) -> BackfillPreview:
    """What the backfill of ``request`` would move and cost, measured on a sample; it takes no
    lock and writes nothing."""
    with GalleryStore.open(request.store) as gallery:
        spec, source = new_vector_source(params, request, gallery)
        order = (build_ordering(request.chunking.policy), request.chunking.seed)
        return preview_backfill(gallery, spec, source, _serving_check(request), order)


def abort(store: Path) -> AbortRecord:
    """Undo the store's running backfill (``backfill --abort``)."""
    with GalleryStore.open(store) as gallery:
        return abort_backfill(gallery)


def _serving_check(request: BackfillRequest) -> ServingCheck:
    return ServingCheck(
        build_serving_mode(request.serving.mode), request.serving.forward_head is not None
    )


def new_vector_source(
    params: Params, request: BackfillRequest, gallery: GalleryStore
) -> tuple[SpaceSpec, VectorSource]:
    """The target space and the vector source of ``request`` on ``gallery``, every head checked
    against the store's spaces before anything changes."""
    from modelupgrade.store.images import ManifestImageSource
    from modelupgrade.store.models import (
        head_transform_fn,
        model_embed_fn,
        space_for_model,
        store_head_fn,
    )
    from modelupgrade.store.sources import ReEmbedImages, TransformStored

    wanted = request.vectors
    rho = (
        head_transform_fn(wanted.rho_head, request.device, "new_embedding")[0]
        if wanted.rho_head
        else None
    )
    serving = gallery.serving_space()
    active = gallery.backfills.active()
    # The space of the items a backfill moves: a running one's source, else the serving space.
    moving = gallery.space(active.source_space if active else str(serving))
    source: VectorSource
    if wanted.model is not None:
        upgrades = list(request.upgrades_from) or None
        spec = space_for_model(wanted.model, name=request.space, upgrades_from=upgrades)
        if not spec.upgrades_from and serving:
            spec = space_for_model(wanted.model, name=request.space, upgrades_from=[serving])
        embed = model_embed_fn(wanted.model, params.store.embed_batch_size, request.device)
        source = ReEmbedImages(
            ManifestImageSource(params.dataset),
            embed if rho is None else (lambda images: rho(embed(images))),
            wanted.changed_sources,
        )
    else:
        if not request.space:
            raise UserError(
                "--space is required without --model",
                hint="name the new model version, e.g. gen1-bict",
            )
        parents = tuple(request.upgrades_from) or ((serving,) if serving else ())
        if wanted.transform_head is not None:
            transform, card = store_head_fn(
                gallery, wanted.transform_head, request.space, request.device
            )
            check_head(wanted.transform_head, "--transform-head", card, moving)
            dim, ref = card.out_dim, str(wanted.transform_head)
            source = TransformStored(transform)
        else:
            assert wanted.table is not None, "NewVectors holds exactly one source"
            source, dim, ref = _table_source(wanted.table, wanted.items, rho)
        spec = SpaceSpec(request.space, dim, parents, backward_compatible=True, model_ref=ref)
    if rho is not None:
        spec = SpaceSpec(
            spec.name, spec.dim, spec.upgrades_from, spec.backward_compatible, spec.model_ref, "rho"
        )
    if request.serving.forward_head is not None:
        from modelupgrade.heads import read_head_card

        head = request.serving.forward_head
        check_head(head, "--forward-head", read_head_card(head), moving, spec)
    return spec, source


def _table_source(
    table: Path, items: Path | None, rho: TransformFn | None
) -> tuple[VectorSource, int, str]:
    from modelupgrade.data.vector_table import is_vector_table, read_vector_table
    from modelupgrade.store.ingest import read_item_table
    from modelupgrade.store.sources import TableVectors

    if is_vector_table(table):  # its own ids: --items is not needed to name the rows
        given = read_vector_table(table, "new vector table")
        item_ids, vectors = given.item_ids, given.vectors
    else:
        assert items is not None, "NewVectors checks that a .npy table comes with --items"
        frame = read_item_table(items)
        vectors = load_array(table, "new vector table")
        if "item_id" not in frame.columns:
            raise UserError(f"{items} has no item_id column")
        item_ids = frame["item_id"].astype(str).tolist()
    source = TableVectors(item_ids, vectors if rho is None else rho(vectors))
    return source, vectors.shape[1], str(table)


def check_head(
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


def _on_ray(
    params: Params,
    request: BackfillRequest,
    gallery: GalleryStore,
    spec: SpaceSpec,
    serving: ServingCheck,
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

    wanted, placement = request.vectors, request.ray
    assert placement is not None
    if wanted.rho_head is not None or (wanted.model is None and wanted.transform_head is None):
        raise UserError(
            "the Ray executor re-embeds images (--model) or applies ψ (--transform-head)",
            hint="run a --vectors or --rho-head backfill with --executor local",
        )
    recipe: VectorRecipe = (
        ModelVectors(
            str(wanted.model),
            ManifestImageSource(params.dataset),
            params.store.embed_batch_size,
            wanted.changed_sources,
        )
        if wanted.model is not None
        else HeadVectors(str(wanted.transform_head))
    )
    executor = RayExecutor(recipe)
    options = {"address": placement.address} if placement.address else {"include_dashboard": False}
    ray.init(**options)
    try:
        executor.pool = WorkerPool.for_cluster(
            placement.workers, placement.gpus_per_worker, placement.cpus_per_worker
        )
        return backfill_job(
            gallery, spec, executor, request.chunking, request.progress, serving
        ).run()
    finally:
        ray.shutdown()
