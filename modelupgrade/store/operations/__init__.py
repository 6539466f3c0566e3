"""The store's operations: what every front end (the ``modelupgrade`` commands, the Prefect flows,
the Ray executor) asks of a gallery store, each taking a typed request
(``modelupgrade.store.operations.requests``). The commands only turn flags into requests."""

from modelupgrade.store.operations.backfill import (
    abort,
    backfill_job,
    new_vector_source,
    preview,
    run_backfill,
)
from modelupgrade.store.operations.ingest import IngestReport, ingest
from modelupgrade.store.operations.maintenance import erasure, status, updated, verification
from modelupgrade.store.operations.requests import (
    BackfillRequest,
    Chunking,
    EraseRequest,
    IngestRequest,
    NewVectors,
    RayPlacement,
    Serving,
    UpdateRequest,
)

__all__ = [
    "BackfillRequest",
    "Chunking",
    "EraseRequest",
    "IngestReport",
    "IngestRequest",
    "NewVectors",
    "RayPlacement",
    "Serving",
    "UpdateRequest",
    "abort",
    "backfill_job",
    "erasure",
    "ingest",
    "new_vector_source",
    "preview",
    "run_backfill",
    "status",
    "updated",
    "verification",
]
