"""The gallery store's commands: ingest a gallery, backfill it, search it, serve it, show its
status, verify it, erase and update items, cut over to the new space, roll back, clean up.

Each function is one ``modelupgrade`` subcommand (``store-ingest``, ``backfill``, ``search``,
``serve``, ``store-status``, ``store-verify``, ``store-erase``, ``store-update``, ``cutover``,
``rollback``, ``cleanup``) or the ``demo_store`` stage; its signature and docstring are the command
line (``modelupgrade.cli.arguments``). Each turns its flags into a typed request and calls the
store's operation (``modelupgrade.store.operations``); defaults left out come from the ``store``
section of params.yaml.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from modelupgrade.commands.store_backfill import BackfillFlags
from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject
from modelupgrade.retrieval.distance import check_distance
from modelupgrade.store import operations
from modelupgrade.store.ledger import AbortRecord
from modelupgrade.store.live import Erasure, Update
from modelupgrade.store.operations.ingest import IngestReport
from modelupgrade.store.operations.requests import (
    EraseRequest,
    IngestRequest,
    UpdateRequest,
)
from modelupgrade.store.operations.serving import QuerySide, SearchRequest, SearchResult
from modelupgrade.store.preview import BackfillPreview
from modelupgrade.store.report import BackfillReport
from modelupgrade.store.sources import ChangedSources
from modelupgrade.store.status import StoreStatus
from modelupgrade.store.steps import ServingStep
from modelupgrade.store.verify import VerifyReport

log = logging.getLogger(__name__)


def _store(params: Params, store: Path | None) -> Path:
    return Path(store) if store is not None else Path(params.store.path)


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

    Items may be ingested while a backfill runs: in the backfill's source space they join it
    (queued after its last chunk, served from the source space until moved), in its target space
    they are in it at once. Two ingests into a store that does not exist yet both land in it.

    Args:
        params: the params file: store and dataset sections
        items: manifest or split parquet naming the gallery items (item_id, path, index, label)
        model: model directory whose embedding space the vectors are in
        store: store directory (default: store.path of params.yaml)
        vectors: the items' vectors: an item_id + embedding parquet table (looked up by id), or a
            .npy matrix (row i = the items table's row i); omit to embed the images
        space: space name (default: the model directory's name)
        score: ordering scores to store with each item, computed from the stored vectors:
            old-confidence and old-entropy (the model's classifier), fastfill-sigma2 (needs
            --fastfill-head); give the option with no value to store none
        score_file: KIND=PATH: precomputed ordering scores (.npy, one per item), e.g.
            fastfill-sigma2=sigma2.npy
        fastfill_head: a FastFill head whose σ² gives the fastfill-sigma2 score
        device: torch device that runs the models and heads: cpu, cuda, cuda:1
    """
    request = IngestRequest(
        _store(params, store),
        items,
        model,
        vectors,
        space,
        tuple(score),
        tuple(score_file),
        fastfill_head,
        device,
    )
    return operations.ingest(params, request)


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
    changed_sources: ChangedSources = "refuse",
    device: str = "cpu",
    progress: bool = True,
    executor: Literal["local", "ray"] = "local",
    ray_address: str | None = None,
    workers: int | None = None,
    gpus_per_worker: float | None = None,
    cpus_per_worker: float = 1.0,
) -> BackfillReport | BackfillPreview | AbortRecord:
    """Backfill the store into the new model's space, resumably; SIGTERM stops at a chunk boundary.

    Everything that can be checked is checked before the store changes: the model or head against
    the store's spaces (dimensions, and a sample of items computed), and whether the serving mode
    can answer queries while the backfill runs. One backfill at a time: a store that another
    backfill writes is refused, naming it; ingests, updates and erasures go on meanwhile. Exit
    codes: 0 when every item is in the new space (also when run again after that), 1 when items
    failed (store-status lists them; --retry-failed or --abort), 143 when stopped by SIGTERM, 2
    for bad input.

    Args:
        params: the params file: store and dataset sections, the seed
        store: store directory (default: store.path of params.yaml)
        model: new model directory: re-embed every item's image
        transform_head: forward head: apply ψ to the stored vectors (no images needed)
        vectors: the new vectors computed elsewhere: an item_id + embedding parquet table, or a
            .npy matrix with --items naming its rows
        items: with a .npy --vectors: the parquet naming the item of each row (an item_id column)
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
        changed_sources: with --model: an item whose image changed since its stored vector was
            made is refused (it fails, named, and stays in its old space), or with accept
            re-embedded from the new image (its content recorded)
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
    # Every argument but the params, by name: the flags the backfill's request is made of.
    flags = BackfillFlags(**{name: value for name, value in locals().items() if name != "params"})
    return flags.run(params)


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
    distance: str | None = None,
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
    from modelupgrade.store.operations.serving import search as searched

    config = params.store
    request = SearchRequest(
        _store(params, store),
        mode or config.serving_mode,
        config.top_k if k is None else k,
        check_distance(distance or config.distance),
        queries,
        old_queries,
        rows,
        tuple(item_id),
    )
    if request.k < 1:
        raise UserError(f"--k must be at least 1, got {k}", hint="--k is the hits per query")
    return searched(request, load_head_transforms(forward_head, reverse_head, device))


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
    queries and ask for at most store.max_k hits each, in a body of at most
    store.max_request_bytes received within store.request_timeout_s.

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
    from modelupgrade.store.models import load_head_transforms
    from modelupgrade.store.service import run_service

    run_service(
        _store(params, store),
        params.store,
        host,
        port,
        mode,
        load_head_transforms(forward_head, reverse_head, device),
    )


def store_status(params: Params, store: Path | None = None) -> StoreStatus:
    """What a store holds: items per space and state, its spaces and scores, its last backfill,
    and its index with its recall@10 against an exact scan in each space.

    Args:
        params: the params file: its store section gives the default store
        store: store directory (default: store.path of params.yaml)
    """
    return operations.status(_store(params, store))


def store_verify(
    params: Params, store: Path | None = None, sample: int | None = None
) -> VerifyReport:
    """Check a store against what its writers committed; exit 1 with a report when it is not.

    Every vector against its checksum and the space recorded with it, the item table against its
    constraints (by a full scan), SQLite's integrity check, the backfill ledger, and the vector
    backend against the ledger (no vectors of a dropped space or an erased item left, none of a
    live one missing, the Milvus serving alias where the last cutover put it). It reads only.

    Args:
        params: the params file: its store section gives the default store
        store: store directory (default: store.path of params.yaml)
        sample: check that many vectors per space (a quick check), not every one
    """
    return operations.verification(_store(params, store), sample)


def store_erase(
    params: Params,
    reason: str,
    store: Path | None = None,
    item_id: Sequence[str] = (),
    items: Path | None = None,
) -> Erasure:
    """Erase items: every vector of them in every space, their scores, sources and records.

    The erasure is recorded (when, who, why, how many; never which items). An erased item is never
    returned again: not by a running or resumed backfill, not after a rollback, a cutover or a
    cleanup. Runs while a backfill does.

    Args:
        params: the params file: its store section gives the default store
        reason: why, recorded with who and when (e.g. the request that asks for it)
        store: store directory (default: store.path of params.yaml)
        item_id: ids of the items to erase
        items: a table (.parquet or .csv) whose item_id column names items to erase
    """
    request = EraseRequest.of(_store(params, store), item_id, items, reason)
    return operations.erasure(request)


def store_update(
    params: Params,
    items: Path,
    store: Path | None = None,
    vectors: Sequence[str] = (),
    model: Sequence[Path] = (),
    device: str = "cpu",
) -> Update:
    """Update items whose content changed: their new vectors in every space that keeps one.

    During a backfill, an item's vector in the backfill's target is recomputed by the backfill
    (the item is queued again and served from its old space until then). Readers never meet an
    item half-updated.

    Args:
        params: the params file: store and dataset sections
        items: a table (.parquet or .csv) of the items (item_id, path, index, label): where their
            new content is
        store: store directory (default: store.path of params.yaml)
        vectors: SPACE=FILE: the items' new vectors in SPACE (.npy, row i = row i of --items)
        model: model directories that embed the items' new images, each into its own space
        device: torch device that runs the models: cpu, cuda, cuda:1
    """
    given: dict[str, Path] = {}
    for pair in vectors:
        space, sep, path = pair.partition("=")
        if not sep or not space or not path:
            raise UserError(
                f"--vectors {pair!r} is not SPACE=FILE", hint="e.g. --vectors gen0=new_gen0.npy"
            )
        given[space] = Path(path)
    request = UpdateRequest(_store(params, store), items, given, tuple(model), device)
    return operations.updated(params, request)


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
    from modelupgrade.store.operations.serving import cutover as cut_over

    return cut_over(
        params,
        _store(params, store),
        reason,
        query_split,
        QuerySide(new_query_vectors, new_model),
        QuerySide(old_query_vectors, old_model),
        device,
    )


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
    from modelupgrade.store.operations.serving import rollback as roll_back

    return roll_back(_store(params, store), reason)


def cleanup(
    params: Params, reason: str, store: Path | None = None, force: bool = False
) -> ServingStep:
    """Drop the old space's vectors of a cut-over backfill once its rollback window has passed.

    The window is store.rollback_window_hours from the cutover. After a cleanup no rollback is
    possible. The step is recorded before the vectors go, so a run interrupted after it finishes
    the drop when the next writer comes.

    Args:
        params: the params file: its store section gives the default store
        reason: why, recorded with who and when (store-status shows it)
        store: store directory (default: store.path of params.yaml)
        force: drop them before the window ends (the --reason says why)
    """
    from modelupgrade.store.operations.serving import cleanup as clean_up

    return clean_up(_store(params, store), reason, force)


def demo_store(
    params: Params,
    old_model: Path,
    new_model: Path,
    gallery: Path,
    out: Path,
    old_embeddings: Path | None = None,
    head: Path | None = None,
    progress: bool = False,
) -> JsonObject:
    """Build the demo gallery store and backfill it with the new model to completion.

    The gallery is ingested with its old-model vectors and every ordering score the old model's
    classifier gives (and FastFill's σ² with --head), then re-embedded with the new model chunk by
    chunk in the order of store.policy. The store is built in place under its lock (DVC removes
    the stage's output before it runs); its summary.json records the run.

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
    from modelupgrade.store.operations.demo import DemoRequest, build_demo_store

    request = DemoRequest(old_model, new_model, gallery, out, old_embeddings, head, progress)
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
        summary, report = build_demo_store(params, request, str(select_device(params.device)))
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
        summary["new_space"],
        report.items_per_second,
        report.items_failed,
    )
    return summary
