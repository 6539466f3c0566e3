"""Keep a gallery store serving one model: create it with the model's vectors, or backfill it.

``follow_model`` is what keeps a store on a registry's champion (the Prefect backfill flow runs it
through ``modelupgrade.chain``): without a store it ingests the gallery with the model's vectors
(``store-ingest``); when another space serves, or a backfill into the model's space was left
running, it runs the real backfill (chunked, crash-safe, resumable; the old vectors keep serving
until each item is re-embedded); when the model's space serves already it does nothing.

The store runs one backfill at a time, so a backfill left running towards another space (the model
to follow moved again meanwhile) is finished first, with the model that space was created from.
Progress goes to a callback every few chunks (about 50 calls per backfill, however large the
gallery); the totals reported are the store's, across every run that worked on the backfill.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from modelupgrade.config import Params
from modelupgrade.json_data import JsonObject
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.report import BackfillReport
from modelupgrade.store.schema import DATABASE_FILE
from modelupgrade.store.status import StoreStatus

# Called with what is backfilled ("<store>: gen0 → gen2") and the fraction of its items done.
Progress = Callable[[str, float], None]

# Progress calls per backfill: often enough to watch, few enough to cost nothing.
PROGRESS_UPDATES = 50


@dataclass
class FollowedModel:
    """What keeping a store on a model did: created it, found it up to date, or backfilled it."""

    store: Path
    space: str  # the model's space
    action: Literal["created", "up to date", "backfilled"]
    status: StoreStatus  # the store afterwards
    source_space: str | None = None  # what served before a backfill
    steps: list[BackfillReport] = field(default_factory=list)  # each backfill run, in order

    @property
    def backfill(self) -> BackfillReport | None:
        """The last backfill run: into the model's space, unless an earlier one did not finish."""
        return self.steps[-1] if self.steps else None

    @property
    def outcome(self) -> str:
        if self.action != "backfilled":
            return f"{self.action}, serving {self.space}"
        ended = self.steps[-1].status
        if ended == "complete":
            return f"backfilled {self.source_space} → {self.space}"
        return f"backfill to {self.space} {ended}; the next run resumes it"

    def as_dict(self) -> JsonObject:
        found: JsonObject = {
            "store": str(self.store),
            "outcome": self.outcome,
            "store_status": self.status.as_dict(),
        }
        if self.action == "backfilled":
            found.update(
                source_space=self.source_space,
                backfill=self.steps[-1].as_dict(),
                steps=[step.target_space for step in self.steps],
            )
        return found


def follow_model(
    params: Params,
    store: Path,
    model_dir: Path,
    items: Path,
    vectors: Path,
    progress: Progress | None = None,
) -> FollowedModel:
    """Make the space of the model in ``model_dir`` serve the store at ``store``.

    A new store ingests the gallery ``items`` (a split parquet) with the model's ``vectors`` of it
    (``.npy``, row i = row i of the items) and the ordering scores the model's classifier gives
    (none for an adopted model, which has no classifier), as ``store-ingest`` does; an existing
    one is backfilled with the model (``params``: store, dataset, seed and device).
    """
    from modelupgrade.store.models import space_for_model

    space = space_for_model(model_dir).name
    if not (Path(store) / DATABASE_FILE).is_file():
        from modelupgrade.models import read_model_card
        from modelupgrade.store.models import CLASSIFIER_SCORES
        from modelupgrade.store.operations import IngestRequest, ingest

        # A model adopted from elsewhere has no classifier to score its items with: its store
        # holds no confidence scores, and a backfill out of it needs a policy that reads none.
        classifier = read_model_card(model_dir).classifier is not None
        request = IngestRequest(
            Path(store),
            items,
            model_dir,
            vectors=vectors,
            scores=CLASSIFIER_SCORES if classifier else (),
        )
        return FollowedModel(Path(store), space, "created", ingest(params, request))
    with GalleryStore.open(store) as gallery:
        before = gallery.status()
        running = before.backfill is not None and before.backfill.status == "running"
        if before.serving_space == space and not running:
            return FollowedModel(Path(store), space, "up to date", before)
        models = [model_dir]
        active = gallery.backfills.active()
        if active is not None and active.target_space != space:
            models.insert(0, Path(str(gallery.space(active.target_space).model_ref)))
        steps: list[BackfillReport] = []
        for model in models:
            steps.append(_backfill(gallery, model, params, progress))
            if steps[-1].status != "complete":
                break
        return FollowedModel(
            Path(store), space, "backfilled", gallery.status(), before.serving_space, steps
        )


def _backfill(
    gallery: GalleryStore, model_dir: Path, params: Params, progress: Progress | None
) -> BackfillReport:
    """Backfill (or resume backfilling) ``gallery`` into ``model_dir``'s space, re-embedding the
    images, a few chunks per run so that ``progress`` hears of each few."""
    from modelupgrade.runtime import select_device
    from modelupgrade.store.operations import (
        BackfillRequest,
        Chunking,
        NewVectors,
        Serving,
        backfill_job,
        new_vector_source,
    )

    serving = gallery.serving_space()
    request = BackfillRequest(
        store=gallery.path,
        vectors=NewVectors(model=model_dir),
        chunking=Chunking.of(params, None, None, None),
        serving=Serving.of(params, None, None),
        upgrades_from=(serving,) if serving else (),
        device=str(select_device(params.device)),
        progress=False,
    )
    target, source = new_vector_source(params, request, gallery)
    job = backfill_job(gallery, target, source, request.chunking, progress=False)
    described = f"{gallery.path}: {serving} → {target.name}"
    chunks = 1
    while True:
        run = job.run(max_chunks=chunks)
        status = gallery.status()
        totals = BackfillReport.whole_backfill(status, run.status)
        state = status.backfill
        assert state is not None  # whole_backfill refused a store without one
        chunks = max(1, -(-state.total // state.chunk_size) // PROGRESS_UPDATES)
        if progress is not None:
            progress(described, (totals.items_written + totals.items_failed) / max(state.total, 1))
        if run.status != "paused":
            return totals
