"""The ingest operation: add items and their vectors in one space to a store, creating it when it
does not exist yet (under its commit lock, so two ingests into a new store both land in it), while
a backfill runs or not. A refused ingest leaves the store as it was, or no store when it was the
one to create it."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from modelupgrade.arrays import load_array
from modelupgrade.config import Params
from modelupgrade.errors import EXIT_INCOMPLETE, UserError
from modelupgrade.store.backends import BackendSettings
from modelupgrade.store.faults import boundary
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.operations.requests import IngestRequest
from modelupgrade.store.schema import ItemFailure
from modelupgrade.store.shown import item_lines, labelled
from modelupgrade.store.status import StoreStatus

log = logging.getLogger(__name__)


@dataclass
class IngestReport(StoreStatus):
    """The store after an ingest, and the items the ingest skipped (images it could not read):
    an ingest that skipped items exits with ``EXIT_INCOMPLETE``."""

    skipped: list[ItemFailure] = field(default_factory=list)

    @classmethod
    def of(cls, status: StoreStatus, skipped: Sequence[ItemFailure]) -> IngestReport:
        return cls(**vars(status), skipped=list(skipped))

    @property
    def exit_code(self) -> int:
        return EXIT_INCOMPLETE if self.skipped else 0

    def describe(self) -> str:
        status = super().describe()
        if not self.skipped:
            return status
        skipped = [labelled("skipped", f"{len(self.skipped):,} item(s), not in the store:")]
        return "\n".join([status, *skipped, *item_lines(self.skipped)])

    @property
    def exit_message(self) -> str | None:
        if not self.skipped:
            return None
        first = self.skipped[0]
        return (
            f"{len(self.skipped)} item(s) were skipped and are not in the store, e.g. "
            f"{first.item_id} ({first.reason}); each is logged above and listed on stdout "
            "(--json: under 'skipped')\n  hint: fix them and ingest those items again"
        )


def score_files(pairs: Sequence[str]) -> dict[str, np.ndarray]:
    """``KIND=PATH`` pairs as ordering scores by kind."""
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


def ingest(params: Params, request: IngestRequest) -> IngestReport:
    """Add ``request``'s items to its store (see the module); every check that needs no store
    runs before one is touched."""
    fill, skipped = _filler(params, request)
    report = filled(request.store, fill, BackendSettings.of(params.store))
    return IngestReport.of(report, skipped)


def _filler(
    params: Params, request: IngestRequest
) -> tuple[Callable[[GalleryStore], None], list[ItemFailure]]:
    from modelupgrade.data.vector_table import vectors_for_items
    from modelupgrade.ordering.scores import score_kind_of
    from modelupgrade.store.images import ManifestImageSource
    from modelupgrade.store.ingest import (
        ingest_embedding_table,
        ingest_images,
        item_rows,
        read_item_table,
    )
    from modelupgrade.store.models import model_embed_fn, ordering_scores, space_for_model
    from modelupgrade.store.vectors import check_vectors

    frame = read_item_table(request.items)
    item_ids, sources = item_rows(frame, f"item table {request.items}")
    spec = space_for_model(request.model, name=request.space)
    given = score_files(request.score_files)
    computed_kinds = [kind for kind in request.scores if kind not in given]
    for kind in [*computed_kinds, *given]:
        score_kind_of(kind)
    skipped: list[ItemFailure] = []
    if request.vectors is not None:
        # Checked before any score is computed from them: a wrong table is one error line.
        given_vectors = vectors_for_items(request.vectors, item_ids, "embedding table")
        table = check_vectors(given_vectors, spec, f"vectors in {request.vectors}")
        scores = (
            {
                **ordering_scores(request.model, table, computed_kinds, request.fastfill_head),
                **given,
            }
            if computed_kinds
            else given
        )

        def fill(gallery: GalleryStore) -> None:
            added = ingest_embedding_table(gallery, frame, table, spec, scores)
            log.info("ingested %d items into space %r of %s", added, spec.name, request.store)

        return fill, skipped
    if computed_kinds:
        raise UserError(
            f"the scores {computed_kinds} are computed from the stored vectors, "
            "which --vectors gives",
            hint="pass --vectors, or --score-file KIND=PATH for each score, or "
            "--score with no value",
        )

    def fill_from_images(gallery: GalleryStore) -> None:
        skipped[:] = ingest_images(
            gallery,
            item_ids,
            sources,
            ManifestImageSource(params.dataset),
            model_embed_fn(request.model, params.store.embed_batch_size, request.device),
            spec,
            given,
        )
        for item in skipped:
            log.warning("skipped %s: %s", item.item_id, item.reason)

    return fill_from_images, skipped


def filled(
    path: Path, fill: Callable[[GalleryStore], None], backend: BackendSettings
) -> StoreStatus:
    """The store at ``path`` after ``fill``, created (its vectors in ``backend``) when absent; a
    new store that ``fill`` refuses is removed again, under the lock it was created under."""
    existed = path.exists()
    gallery, created = GalleryStore.open_or_create(path, backend)
    with gallery:
        with gallery.committing("ingest"):
            try:
                fill(gallery)
            except BaseException:
                if created:
                    _remove_new_store(gallery, path, existed)
                raise
            boundary("ingest:filled")
        return gallery.status()


def _remove_new_store(gallery: GalleryStore, path: Path, existed: bool) -> None:
    """Remove the store this process created and could not fill, holding the commit lock it was
    created under (it holds nothing anyone else wrote: another writer waits for that lock, then
    finds the store gone)."""
    for storage in gallery.vectors.stored():
        gallery.vectors.discard(storage)
    gallery.vectors.close()
    if existed:
        for entry in path.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)
